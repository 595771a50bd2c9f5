"""LUSPO (arXiv 2602.05261): GSPO's sequence term scaled by the response length.

A sequence-level term is put on every token of its response, as GSPO does, so
seq_mean_token_mean returns the mean over sequences of that term. docs/options/successor-losses.md
compares it with TRL and verl.
"""

from __future__ import annotations

import torch

from gspo_cli.algorithms.losses.gspo import gspo_loss
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    TokenLoss,
)


def luspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own (passed on to GSPO)
) -> TokenLoss:
    """LUSPO (arXiv 2602.05261, Eq. 7): GSPO's sequence term times the response length,

        J = (1/G) sum_i |y_i| * min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i),

    so each token of y_i gets the gradient s_i A_i grad log pi (Eq. 8) with no 1/|y_i|.
    Every token carries |y_i| x GSPO's sequence loss: seq_mean_token_mean (the only aggregation
    allowed, its spec's `loss_aggs`) then gives Eq. 7. Ratio, clip and clip decisions are
    GSPO's, one per sequence.
    """
    gspo = gspo_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, options=options)
    lengths = mask.sum(dim=1, keepdim=True)  # [B, 1] |y_i|
    return TokenLoss(gspo.loss * lengths, gspo.ratio)  # [B, T], [B, T]


# Section 4's clip range. Its |y_i| factor is written for seq_mean_token_mean: token_mean or a
# token sum would weigh each sequence by |y_i|^2. Its ratio is GSPO's, one per sequence.
LOSS_SPECS.add(
    "luspo",
    LossSpec(
        luspo_loss,
        (2e-3, 2.5e-3),
        loss_aggs=frozenset({"seq_mean_token_mean"}),
        sequence_ratio=True,
    ),
)
