"""`compute_policy_loss`: the public entry point that turns log-probs into a loss and metrics."""

from __future__ import annotations

import torch

from gspo_cli.algorithms.aggregation import aggregate
from gspo_cli.algorithms.kl import DEFAULT_KL_ESTIMATOR, token_kl
from gspo_cli.algorithms.losses import (
    DEFAULT_LOSS_OPTIONS,
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    LossOptions,
    resolve_loss_agg,
    sequence_log_ratio,
)
from gspo_cli.algorithms.turns import split_turns


def compute_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    algorithm: str,
    clip_low: float,
    clip_high: float,
    loss_agg: str | None = None,
    normalizer: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    group_size: int | None = None,
    token_weights: torch.Tensor | None = None,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,
    kl_estimator: str = DEFAULT_KL_ESTIMATOR,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    turns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy-gradient loss of `algorithm` and its metrics.

    Args:
        logprobs: `[B, T]` log pi(y_t) under the policy being trained (with grad).
        old_logprobs: `[B, T]` log pi_old(y_t) of the policy that sampled the responses.
        advantages: `[B]` one per response, or `[B, T]` per token (GSPO-token, GRPO).
        mask: `[B, T]` 1 on response tokens, 0 on prompt and padding.
        algorithm: a registered loss (`POLICY_LOSSES`: gspo, grpo, luspo, sapo, gmpo, ...).
        clip_low, clip_high: the range [1-eps_low, 1+eps_high] (GMPO: in log space; SAPO: unused).
        loss_agg: aggregation name; None is the algorithm's paper's (`resolve_loss_agg`).
        normalizer: denominator shared by all micro-batches of one optimiser step (sequences
            or tokens, see `loss_normalizer`); None normalises by this batch alone.
        ref_logprobs: `[B, T]` reference-policy log-probs for the optional KL penalty.
        kl_coef: weight of the KL penalty in the loss (`kl_estimator` per token); 0 disables it.
        group_size: G; when given, the metrics include the share of zero-advantage groups.
        token_weights: `[B, T]` importance weights (no grad) on each token's policy loss, e.g.
            a rollout correction; None weighs every token 1.
        options: knobs of particular losses (SAPO's temperatures).
        kl_estimator: a registered KL estimator (algorithms/kl.py); k3 by default.
        entropy: `[B, T]` the policy's entropy per token, with grad, for the entropy bonus.
        entropy_coef: c_H of L = L_pg - c_H * H (H aggregated like the policy loss); 0 = off.
        turns: `[B, T]` each model token's turn in a tool trajectory (-1 elsewhere): each turn
            is then its own sequence with its response's advantage (`sequence_unit: turn`);
            None: the response is one sequence. Tool tokens are 0 in `mask` either way.

    Returns:
        A 0-dim loss to minimise, and metrics (floats, computed without grad).
    """
    # long on purpose: the one public entry point, mostly its arguments and their docs.
    loss_fn = POLICY_LOSSES.get(algorithm)
    agg = resolve_loss_agg(algorithm, loss_agg)
    if clip_low <= 0 or clip_high <= 0:
        raise ValueError(f"clip ranges must be positive, got {clip_low}, {clip_high}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError("logprobs, old_logprobs and mask must share one [B, T] shape")

    mask = mask.to(logprobs.dtype)
    old_logprobs = old_logprobs.detach()
    zero_adv_groups = _zero_adv_group_frac(advantages, group_size)  # per response, not turn
    if turns is not None:  # one row per turn, every tensor of the loss alike
        rows, mask = split_turns(turns, mask)  # [R], [R, T]
        logprobs, old_logprobs, advantages = logprobs[rows], old_logprobs[rows], advantages[rows]
        ref_logprobs, token_weights, entropy = (
            None if t is None else t[rows] for t in (ref_logprobs, token_weights, entropy)
        )
    token_adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    token_adv = token_adv.to(logprobs.dtype).expand_as(logprobs).detach()  # [B, T]

    token_loss, ratio, clipped = loss_fn(
        logprobs, old_logprobs, token_adv, mask, clip_low, clip_high, options=options
    )
    if token_weights is not None:
        token_loss = token_loss * token_weights.detach().to(token_loss.dtype)  # [B, T]
    kl = None
    if ref_logprobs is not None and kl_coef != 0.0:
        kl = token_kl(logprobs, ref_logprobs.detach(), kl_estimator)  # [B, T]
        token_loss = token_loss + kl_coef * kl
    if entropy is not None and entropy_coef != 0.0:  # a bonus: higher entropy, lower loss
        token_loss = token_loss - entropy_coef * entropy.to(token_loss.dtype)  # [B, T]
    loss = aggregate(token_loss, mask, agg, normalizer)

    metrics = _metrics(logprobs, old_logprobs, token_adv, mask, ratio, clip_low, clip_high, clipped)
    if kl is not None:
        metrics["kl"] = _masked_mean(kl.detach(), mask)
    if entropy is not None and entropy_coef != 0.0:
        metrics["entropy_bonus"] = entropy_coef * _masked_mean(entropy.detach(), mask)
    if zero_adv_groups is not None:
        metrics["zero_adv_group_frac"] = zero_adv_groups
    return loss, metrics


def _zero_adv_group_frac(advantages: torch.Tensor, group_size: int | None) -> float | None:
    if group_size is None or advantages.dim() != 1:
        return None
    groups = advantages.detach().view(-1, group_size)  # [Q, G]
    return (groups == 0).all(dim=1).float().mean().item()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((values * mask).sum() / mask.sum().clamp(min=1)).item())


@torch.no_grad()
def _metrics(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    ratio: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clipped: torch.Tensor | None = None,
) -> dict[str, float]:
    """Clip fractions (token-weighted, only where the clip binds) and ratio statistics.

    `clipped` `[B, T]` (+1 upper, -1 lower, 0 none) comes from losses whose clip is not the
    PPO rule on `ratio` (GMPO, CISPO, SAPO); None applies that rule.
    """
    valid = mask > 0  # [B, T]
    n_tokens = valid.sum().clamp(min=1).float()
    if clipped is None:
        clip_high_hit = (ratio > 1.0 + clip_high) & (token_adv > 0) & valid  # [B, T]
        clip_low_hit = (ratio < 1.0 - clip_low) & (token_adv < 0) & valid  # [B, T]
    else:
        clip_high_hit = (clipped > 0) & valid  # [B, T]
        clip_low_hit = (clipped < 0) & valid  # [B, T]
    log_w = (logprobs.detach() - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    token_ratio = log_w.exp()[valid]  # [n_tokens]
    has_tokens = valid.any(dim=1)  # [B]
    log_s = sequence_log_ratio(logprobs.detach(), old_logprobs, mask)[has_tokens]
    seq_ratio = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B']
    metrics = {
        "clip_frac": float((clip_high_hit | clip_low_hit).sum() / n_tokens),
        "clip_frac_low": float(clip_low_hit.sum() / n_tokens),
        "clip_frac_high": float(clip_high_hit.sum() / n_tokens),
        "zero_adv_seq_frac": float((token_adv * valid == 0).all(dim=1)[has_tokens].float().mean())
        if has_tokens.any()
        else 0.0,
    }
    for name, values in (("token_ratio", token_ratio), ("seq_ratio", seq_ratio)):
        if values.numel() == 0:
            continue
        metrics[f"{name}_mean"] = float(values.mean())
        metrics[f"{name}_min"] = float(values.min())
        metrics[f"{name}_max"] = float(values.max())
    return metrics
