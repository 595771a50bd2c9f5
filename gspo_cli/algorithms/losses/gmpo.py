"""GMPO (arXiv 2507.20673): the geometric mean of token ratios, clipped in log space.

A sequence-level term is put on every token of its response, as GSPO does, so
seq_mean_token_mean returns the mean over sequences of that term. docs/options/successor-losses.md
compares it with TRL and verl.
"""

from __future__ import annotations

import torch

from gspo_cli.algorithms.losses.ratios import LOG_RATIO_CLAMP, sequence_advantage
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    TokenLoss,
)


def gmpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """GMPO (arXiv 2507.20673, Eq. 3-4 and Alg. 1): the geometric mean of token ratios, each
    clipped in LOG space before the mean, on the side its advantage's sign selects:

        lc_it = min(l_it, eps_high) if A_i > 0,  max(l_it, -eps_low) if A_i < 0,
        J = (1/G) sum_i A_i * exp((1/|y_i|) sum_t lc_it),   l_it = log pi - log pi_old.

    `clip_low` / `clip_high` are these log-space bounds (as verl's geo_mean), not ratio offsets:
    the paper's range (e^-0.4, e^0.4) is clip_low = clip_high = 0.4 (Table 5). A_i is the mean
    of `advantages` over the response; A_i = 0 contributes nothing. The mean log-ratio is
    clamped to +-20 like GSPO's.
    """
    seq_adv = sequence_advantage(advantages, mask)  # [B]
    log_r = logprobs - old_logprobs  # [B, T]
    pos = (seq_adv > 0).unsqueeze(1)  # [B, 1]
    neg = (seq_adv < 0).unsqueeze(1)  # [B, 1]
    clipped_lr = torch.where(pos, log_r.clamp(max=clip_high), log_r)  # [B, T]
    clipped_lr = torch.where(neg, clipped_lr.clamp(min=-clip_low), clipped_lr)  # [B, T]
    mean_lr = (clipped_lr * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
    term = seq_adv * mean_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]
    token_loss = (-term).unsqueeze(1).expand_as(logprobs)  # [B, T]
    log_r = log_r.detach()
    high = pos & (log_r > clip_high)  # [B, T] the clip zeroed these tokens' gradient
    low = neg & (log_r < -clip_low)  # [B, T]
    clipped = high.to(torch.int8) - low.to(torch.int8)  # [B, T]
    ratio = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B, T] r_it
    return TokenLoss(token_loss, ratio, clipped)


# Table 5: 0.4 each way in LOG space. Its per-token clip makes its ratio token-level.
LOSS_SPECS.add("gmpo", LossSpec(gmpo_loss, (0.4, 0.4)))
