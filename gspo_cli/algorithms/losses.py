"""Policy losses: GSPO (Eq. 5, 7), GSPO-token (Eq. 13, 14) and GRPO (Eq. 2).

Every loss maps `[B, T]` log-probs to a per-token loss `[B, T]` (to minimise) plus the ratio
each token's clip decision was taken on. `compute_policy_loss` aggregates and adds metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from gspo_cli.registry import Registry

# Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp: a stale or corrupted
# sample (log-ratio of hundreds) would otherwise give inf ratios and NaN gradients. exp(20) ~ 5e8
# is far outside any clip range, so the clamp never changes a value that the clip would keep.
LOG_RATIO_CLAMP = 20.0


class TokenLoss(NamedTuple):
    loss: torch.Tensor  # [B, T] per-token loss to minimise (masked positions are ignored later)
    ratio: torch.Tensor  # [B, T] the ratio each token's clip decision used (no grad needed)


PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float], TokenLoss
]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("algorithm")

# The papers' clip ranges (eps_low, eps_high), used when a recipe leaves them unset:
# GSPO section 5.1 (3e-4 / 4e-4, sequence ratios sit close to 1); GRPO with DAPO's clip-higher.
PAPER_CLIP: dict[str, tuple[float, float]] = {
    "gspo": (3e-4, 4e-4),
    "gspo_token": (3e-4, 4e-4),
    "grpo": (0.2, 0.27),
}

# Losses whose importance ratio is one length-normalised ratio per sequence (no token ratio):
# pi_old may come from the rollout engine's likelihoods (GSPO section 5.4). GSPO-token keeps a
# per-token ratio and GRPO is token-level, so both need the trainer's own pi_old.
SEQUENCE_RATIO_LOSSES = frozenset({"gspo"})


def _clipped_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A): the PPO-style pessimistic surrogate."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`[B]` log s_i = mean over response tokens of (log pi - log pi_old) (Eq. 7)."""
    lengths = mask.sum(dim=1).clamp(min=1)  # [B]
    return ((logprobs - old_logprobs) * mask).sum(dim=1) / lengths  # [B]


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> TokenLoss:
    """GSPO, Eq. 5 and 7: one length-normalised sequence ratio and one clip per response.

    `advantages` is `[B, T]`; the sequence advantage A_i is its mean over response tokens
    (per-token advantages need `gspo_token`).
    """
    seq_adv = (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask)  # [B]
    s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]
    seq_loss = _clipped_objective(s, seq_adv, clip_low, clip_high)  # [B]
    # Every token carries its sequence's loss, so the paper's seq-mean-token-mean aggregation
    # returns mean_i seq_loss_i exactly, and each token's gradient is s_i A_i / |y_i| (Eq. 10).
    token_loss = seq_loss.unsqueeze(1).expand_as(logprobs)  # [B, T]
    return TokenLoss(token_loss, s.detach().unsqueeze(1).expand_as(logprobs))


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> TokenLoss:
    """GSPO-token, Eq. 13 and 14: s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)], per-token advantages."""
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask).detach()  # [B]
    # Where GSPO's clamp binds its gradient is 0; give GSPO-token the same (Eq. 14 equality).
    in_range = (log_s.abs() <= LOG_RATIO_CLAMP).to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    log_s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # Value s_i, gradient s_i * d log pi(y_it): exp(lp - sg(lp)) is 1 with gradient 1.
    s_it = log_s.exp().unsqueeze(1) * ((logprobs - logprobs.detach()) * in_range).exp()  # [B, T]
    token_loss = _clipped_objective(s_it, advantages, clip_low, clip_high)  # [B, T]
    return TokenLoss(token_loss, s_it.detach())


@POLICY_LOSSES.register("grpo")
def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> TokenLoss:
    """GRPO, Eq. 2: a ratio w_it and a clip per token."""
    log_w = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    w = log_w.exp()  # [B, T]
    return TokenLoss(_clipped_objective(w, advantages, clip_low, clip_high), w.detach())
