"""What every loss family shares: importance ratios with their clamp, the sequence advantage
and the PPO-style clipped surrogate."""

from __future__ import annotations

import torch

# Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp: a stale or corrupted
# sample (log-ratio of hundreds) would otherwise give inf ratios and NaN gradients. exp(20) ~ 5e8
# is far outside any clip range. With a positive advantage the clip already holds such a ratio
# flat, so the clamp changes nothing. With a negative advantage it does: the pessimistic min
# keeps the unclipped term r * A for any r above 1 + eps_high, so past the clamp that term is
# exp(20) * A instead of r * A, and its gradient is 0 (the clamp's) instead of growing with r.
# Such a sample is broken rather than learnable; dropping its gradient is the intended guard.
LOG_RATIO_CLAMP = 20.0


def clipped_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A): the PPO-style pessimistic surrogate."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def sequence_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[B]` A_i: the mean of `[B, T]` advantages over response tokens."""
    return (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def token_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """`[B, T]` r_it = pi / pi_old, the log-ratio clamped so that exp stays finite."""
    return (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`[B]` log s_i = mean over response tokens of (log pi - log pi_old) (Eq. 7)."""
    lengths = mask.sum(dim=1).clamp(min=1)  # [B]
    return ((logprobs - old_logprobs) * mask).sum(dim=1) / lengths  # [B]
