"""DPPO (arXiv 2602.04879, "Divergence Proximal Policy Optimization"): a trust region on a
divergence between the policy and the one that sampled, in place of PPO's ratio clip.

Each token keeps the plain importance-weighted policy gradient, -r_t A_t with r_t = pi / pi_old
(no clip of r, and r keeps its gradient), unless the update has already left the trust region
in the direction its advantage pushes: then the token's term is dropped (its gradient is 0).
The divergence is that of the sampled token alone, "binary":

- `dppo_tv`: Delta_t = pi(y_t) - pi_old(y_t), the signed probability difference (binary total
  variation); out when A_t > 0 and Delta_t > delta_high, or A_t <= 0 and Delta_t < -delta_low;
- `dppo_kl`: the KL between the two Bernoulli distributions {y_t, not y_t},
  KL_t = q log(q/p) + (1-q) log((1-q)/(1-p)), q = pi_old(y_t), p = pi(y_t); out when A_t > 0,
  KL_t > delta_high and p > q, or A_t < 0, KL_t > delta_low and p < q.

delta_low / delta_high are `algorithm.clip_low` / `clip_high`; the defaults are the paper's run's
(delta_TV 0.15, delta_KL 0.05, verl's examples/dppo_trainer). The paper anchors the region at the
sampling policy (pi_old = the rollout engine's log-probs: `rollout.use_engine_logprobs`); with the
trainer's recomputed pi_old the region is around it instead (the paper's "recompute" variant).
prime-rl's default loss is dppo_tv (thresholds 0.2, a token mean) with a squared log-ratio KL
term of its own, which is not DPPO's and is not added here (`algorithm.kl_coef` adds a KL).
"""

from __future__ import annotations

import torch

from gspo_cli.algorithms.losses.ratios import token_ratio
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    TokenLoss,
)

DPPO_TV_DELTA = (0.15, 0.15)  # the paper's delta_TV (verl examples/dppo_trainer)
DPPO_KL_DELTA = (0.05, 0.05)  # the paper's delta_KL


def _masked_objective(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
    out_high: torch.Tensor, out_low: torch.Tensor,
) -> TokenLoss:  # fmt: skip
    """-r A on the tokens still inside the region; `out_high` / `out_low` `[B, T]`: where the
    update left it upwards (counts for A > 0) or downwards (for A <= 0)."""
    r = token_ratio(logprobs, old_logprobs)  # [B, T], with grad
    high = (advantages > 0) & out_high  # [B, T]
    low = (advantages <= 0) & out_low  # [B, T]
    keep = ~(high | low)
    token_loss = torch.where(keep, -r * advantages, torch.zeros_like(r))  # [B, T]
    moved = advantages != 0  # a dropped zero-advantage term changes nothing: not counted
    clipped = (high & moved).to(torch.int8) - (low & moved).to(torch.int8)
    return TokenLoss(token_loss, r.detach(), clipped)


def dppo_tv_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """DPPO with the binary total variation Delta_t = pi(y_t) - pi_old(y_t) (module docstring)."""
    delta = logprobs.detach().exp() - old_logprobs.detach().exp()  # [B, T]
    return _masked_objective(
        logprobs, old_logprobs, advantages, delta > clip_high, delta < -clip_low
    )


def _log1m_exp(log_p: torch.Tensor) -> torch.Tensor:
    """log(1 - p) from log p, accurate near p = 1 (expm1), floored where p rounds to 1."""
    one_minus = -torch.expm1(log_p.clamp(max=0.0))
    return one_minus.clamp(min=torch.finfo(log_p.dtype).tiny).log()


def bernoulli_kl(old_logprobs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """`[B, T]` KL(Bern(q) || Bern(p)) with q = pi_old(y_t), p = pi(y_t), from log-probs."""
    q = old_logprobs.exp()
    return q * (old_logprobs - logprobs) + (1 - q) * (
        _log1m_exp(old_logprobs) - _log1m_exp(logprobs)
    )


def dppo_kl_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """DPPO with the binary KL between pi_old and pi on the sampled token (module docstring)."""
    lp, old = logprobs.detach(), old_logprobs.detach()
    kl = bernoulli_kl(old, lp)  # [B, T]
    up, down = lp > old, lp < old
    return _masked_objective(
        logprobs, old_logprobs, advantages, (kl > clip_high) & up, (kl > clip_low) & down
    )


# The loss is per token: every aggregation applies; prime-rl's token mean is the default (the
# paper's verl run uses a sequence mean of token sums over a fixed length, not offered here).
LOSS_SPECS.add("dppo_tv", LossSpec(dppo_tv_loss, DPPO_TV_DELTA, paper_loss_agg="token_mean"))
LOSS_SPECS.add("dppo_kl", LossSpec(dppo_kl_loss, DPPO_KL_DELTA, paper_loss_agg="token_mean"))
