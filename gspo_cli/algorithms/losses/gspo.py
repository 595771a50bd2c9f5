"""GSPO's two variants: GSPO (Eq. 5, 7), one ratio per sequence, and GSPO-token (Eq. 13, 14),
the same ratio on every token with per-token advantages."""

from __future__ import annotations

import torch

from gspo_cli.algorithms.losses.ratios import (
    LOG_RATIO_CLAMP,
    clipped_objective,
    sequence_advantage,
    sequence_log_ratio,
)
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    TokenLoss,
)

# GSPO section 5.1's clip range: sequence ratios sit close to 1.
GSPO_CLIP = (3e-4, 4e-4)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """GSPO, Eq. 5 and 7: one length-normalised sequence ratio and one clip per response.

    `advantages` is `[B, T]`; the sequence advantage A_i is its mean over response tokens
    (per-token advantages need `gspo_token`).
    """
    seq_adv = sequence_advantage(advantages, mask)  # [B]
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask)  # [B]
    s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]
    seq_loss = clipped_objective(s, seq_adv, clip_low, clip_high)  # [B]
    # Every token carries its sequence's loss, so the paper's seq-mean-token-mean aggregation
    # returns mean_i seq_loss_i exactly, and each token's gradient is s_i A_i / |y_i| (Eq. 10).
    token_loss = seq_loss.unsqueeze(1).expand_as(logprobs)  # [B, T]
    return TokenLoss(token_loss, s.detach().unsqueeze(1).expand_as(logprobs))


# One ratio per sequence: pi_old may come from the rollout engine's likelihoods (section 5.4).
LOSS_SPECS.add("gspo", LossSpec(gspo_loss, GSPO_CLIP, sequence_ratio=True))


def gspo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """GSPO-token, Eq. 13 and 14: s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)], per-token advantages."""
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask).detach()  # [B]
    # Where GSPO's clamp binds its gradient is 0; give GSPO-token the same (Eq. 14 equality).
    in_range = (log_s.abs() <= LOG_RATIO_CLAMP).to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    log_s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # Value s_i, gradient s_i * d log pi(y_it): exp(lp - sg(lp)) is 1 with gradient 1.
    s_it = log_s.exp().unsqueeze(1) * ((logprobs - logprobs.detach()) * in_range).exp()  # [B, T]
    token_loss = clipped_objective(s_it, advantages, clip_low, clip_high)  # [B, T]
    return TokenLoss(token_loss, s_it.detach())


# GSPO's clip range; the per-token ratio s_it needs the trainer's own pi_old.
LOSS_SPECS.add("gspo_token", LossSpec(gspo_token_loss, GSPO_CLIP))
