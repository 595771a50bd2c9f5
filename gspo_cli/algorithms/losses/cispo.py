"""CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE with a clipped, detached IS weight.

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


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4-5): REINFORCE with a clipped, detached IS
    weight, so every token keeps a gradient:

        J = (1/sum_i |y_i|) sum_i sum_t sg[clip(r_it, 1-eps_low, 1+eps_high)] A_it log pi(y_it).

    The paper sets eps_low "large" (no lower bound) and reports no eps_high; the default
    (1.0, 0.2) puts the lower bound at 0, which a ratio never crosses (verl's example uses 10,
    the same thing), and takes verl's example eps_high 0.2. Its paper aggregation is
    token_mean (its spec's `paper_loss_agg`). The loss value (-w A log pi) is a surrogate: only
    its gradient means something.
    """
    r = token_ratio(logprobs, old_logprobs).detach()  # [B, T]
    weight = r.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T] sg[clip(r)]
    token_loss = -weight * advantages * logprobs  # [B, T]
    moved = advantages != 0  # [B, T] where clipping the weight changes the gradient
    high = moved & (r > 1.0 + clip_high)
    low = moved & (r < 1.0 - clip_low)
    return TokenLoss(token_loss, r, high.to(torch.int8) - low.to(torch.int8))


# eps_low 1 is "no lower bound" (r > 0), eps_high 0.2 as verl's example (the paper gives none);
# the paper normalises by all tokens (Eq. 4).
LOSS_SPECS.add("cispo", LossSpec(cispo_loss, (1.0, 0.2), paper_loss_agg="token_mean"))
