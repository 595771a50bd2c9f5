"""`compute_policy_loss`: the public entry point that turns log-probs into a loss and metrics."""

from __future__ import annotations

from typing import NamedTuple

import torch

from gspo_cli.algorithms.aggregation import aggregate
from gspo_cli.algorithms.kl import DEFAULT_KL_ESTIMATOR, token_kl
from gspo_cli.algorithms.losses import (
    DEFAULT_LOSS_OPTIONS,
    LOG_RATIO_CLAMP,
    LOSS_SPECS,
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
    """The policy-gradient loss of `algorithm` (a name in `LOSS_SPECS`) and its metrics.

    Args:
        logprobs, old_logprobs: `[B, T]` log pi(y_t) under the policy being trained (with
            grad) and log pi_old(y_t) of the policy that sampled the responses.
        advantages: `[B]` one per response, or `[B, T]` per token (GSPO-token, GRPO).
        mask: `[B, T]` 1 on response tokens, 0 on prompt, padding and tool tokens.
        clip_low, clip_high: the range [1-eps_low, 1+eps_high] (GMPO: in log space; SAPO: unused).
        loss_agg: aggregation name; None is the algorithm's paper's (`resolve_loss_agg`).
        normalizer: denominator shared by all micro-batches of one optimiser step (sequences
            or tokens, see `loss_normalizer`); None normalises by this batch alone.
        ref_logprobs, kl_coef, kl_estimator: `[B, T]` reference-policy log-probs, the weight of
            the KL penalty (0 disables it) and its per-token estimator (algorithms/kl.py).
        group_size: G; when given, the metrics include the share of zero-advantage groups.
        token_weights: `[B, T]` importance weights (no grad) on each token's policy loss, e.g.
            a rollout correction; None weighs every token 1.
        options: knobs of particular losses (SAPO's temperatures).
        entropy, entropy_coef: `[B, T]` the policy's entropy per token, with grad, and c_H of
            L = L_pg - c_H * H (H aggregated like the policy loss); 0 = off.
        turns: `[B, T]` each model token's turn in a tool trajectory (-1 elsewhere): each turn
            is its own sequence with its response's advantage (`sequence_unit: turn`); None:
            the response is one sequence.

    Returns a 0-dim loss to minimise, and metrics (floats, computed without grad).
    """
    spec = LOSS_SPECS.get(algorithm)
    agg = resolve_loss_agg(algorithm, loss_agg)
    _check_inputs(logprobs, old_logprobs, mask, clip_low, clip_high)
    zero_adv_groups = _zero_adv_group_frac(advantages, group_size)  # per response, not turn
    rows = _loss_rows(
        logprobs, old_logprobs, advantages, mask, turns, ref_logprobs, token_weights, entropy
    )
    lp, old, adv, mask = rows.logprobs, rows.old_logprobs, rows.token_adv, rows.mask
    token_loss, ratio, clipped = spec.loss(lp, old, adv, mask, clip_low, clip_high, options=options)
    token_loss, kl = _add_penalties(token_loss, rows, kl_coef, kl_estimator, entropy_coef)
    loss = aggregate(token_loss, mask, agg, normalizer)
    metrics = _metrics(lp, old, adv, mask, ratio, clip_low, clip_high, clipped)
    metrics.update(_penalty_metrics(rows, kl, entropy_coef, zero_adv_groups))
    return loss, metrics


class _LossRows(NamedTuple):
    """The loss's inputs, one row per sequence (a response, or a turn of one), detached where
    no gradient flows; `token_adv` is `[B, T]` whatever the advantages' shape."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    token_adv: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None
    token_weights: torch.Tensor | None
    entropy: torch.Tensor | None


def _check_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> None:
    if clip_low <= 0 or clip_high <= 0:
        raise ValueError(f"clip ranges must be positive, got {clip_low}, {clip_high}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError("logprobs, old_logprobs and mask must share one [B, T] shape")


def _loss_rows(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    turns: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    token_weights: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> _LossRows:
    """The loss's rows: with `turns`, one row per turn, every tensor of the loss alike."""
    mask = mask.to(logprobs.dtype)
    old_logprobs = old_logprobs.detach()
    if turns is not None:
        rows, mask = split_turns(turns, mask)  # [R], [R, T]
        logprobs, old_logprobs, advantages = logprobs[rows], old_logprobs[rows], advantages[rows]
        ref_logprobs, token_weights, entropy = (
            None if t is None else t[rows] for t in (ref_logprobs, token_weights, entropy)
        )
    token_adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    token_adv = token_adv.to(logprobs.dtype).expand_as(logprobs).detach()  # [B, T]
    return _LossRows(logprobs, old_logprobs, token_adv, mask, ref_logprobs, token_weights, entropy)


def _add_penalties(
    token_loss: torch.Tensor,
    rows: _LossRows,
    kl_coef: float,
    kl_estimator: str,
    entropy_coef: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[B, T]` the policy loss weighted by `token_weights`, plus the KL penalty, minus the
    entropy bonus; and the per-token KL when the penalty is on (None otherwise)."""
    if rows.token_weights is not None:
        token_loss = token_loss * rows.token_weights.detach().to(token_loss.dtype)  # [B, T]
    kl = None
    if rows.ref_logprobs is not None and kl_coef != 0.0:
        kl = token_kl(rows.logprobs, rows.ref_logprobs.detach(), kl_estimator)  # [B, T]
        token_loss = token_loss + kl_coef * kl
    if rows.entropy is not None and entropy_coef != 0.0:  # a bonus: higher entropy, lower loss
        token_loss = token_loss - entropy_coef * rows.entropy.to(token_loss.dtype)  # [B, T]
    return token_loss, kl


def _penalty_metrics(
    rows: _LossRows,
    kl: torch.Tensor | None,
    entropy_coef: float,
    zero_adv_groups: float | None,
) -> dict[str, float]:
    """The KL, the entropy bonus and the zero-advantage group share, where each applies."""
    metrics: dict[str, float] = {}
    if kl is not None:
        metrics["kl"] = _masked_mean(kl.detach(), rows.mask)
    if rows.entropy is not None and entropy_coef != 0.0:
        metrics["entropy_bonus"] = entropy_coef * _masked_mean(rows.entropy.detach(), rows.mask)
    if zero_adv_groups is not None:
        metrics["zero_adv_group_frac"] = zero_adv_groups
    return metrics


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
