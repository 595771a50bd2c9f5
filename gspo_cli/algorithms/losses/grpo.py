"""GRPO (Eq. 2 of the GSPO paper): a ratio and a clip per token."""

from __future__ import annotations

import torch

from gspo_cli.algorithms.losses.ratios import clipped_objective, token_ratio
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    TokenLoss,
)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """GRPO, Eq. 2: a ratio w_it and a clip per token."""
    w = token_ratio(logprobs, old_logprobs)  # [B, T]
    return TokenLoss(clipped_objective(w, advantages, clip_low, clip_high), w.detach())


# 0.2 with DAPO's clip-higher (0.27); token-level, so it needs the trainer's own pi_old.
LOSS_SPECS.add("grpo", LossSpec(grpo_loss, (0.2, 0.27)))
