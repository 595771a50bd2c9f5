"""SAPO (arXiv 2511.20347): a soft, temperature-controlled gate instead of a hard clip.

docs/options/successor-losses.md compares it with TRL and verl.
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


def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,
) -> TokenLoss:
    """SAPO (arXiv 2511.20347): a soft, temperature-controlled gate replaces the hard clip,

        f_tau(r) = sigmoid(tau (r - 1)) * 4 / tau,  tau = tau_pos if A_i > 0 else tau_neg,
        J = (1/G) sum_i (1/|y_i|) sum_t f_tau(r_it) A_it.

    Token gradient w_it r_it A_it grad log pi with w = 4 p (1 - p), p = sigmoid(tau (r - 1)):
    1 at r = 1, decaying smoothly away from it. `clip_low` / `clip_high` are unused (there is
    no hard clip) and the clip fractions read 0. The log-ratio is clamped to +-20 as in verl.
    """
    r = token_ratio(logprobs, old_logprobs)  # [B, T]
    # full_like: python-scalar where() would round the temperatures to float32
    tau_pos = torch.full_like(advantages, options.sapo_tau_pos)  # [B, T]
    tau = torch.where(advantages > 0, tau_pos, options.sapo_tau_neg)  # [B, T]
    gate = torch.sigmoid(tau * (r - 1.0)) * 4.0 / tau  # [B, T] f_tau(r)
    token_loss = -gate * advantages  # [B, T]
    return TokenLoss(token_loss, r.detach(), torch.zeros_like(token_loss, dtype=torch.int8))


# No hard clip: the loss ignores the pair (clip fractions read 0), which only sets the window
# of the engine-mismatch metric.
LOSS_SPECS.add("sapo", LossSpec(sapo_loss, (0.2, 0.2), hard_clip=False))
