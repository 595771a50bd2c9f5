"""How per-token losses `[B, T]` become one scalar.

Each aggregation is a sum over response tokens of per-token weights divided by a normaliser.
Passing a `normalizer` computed over the *whole* rollout minibatch (see `loss_normalizer`)
makes gradient accumulation over micro-batches equal one big batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gspo_cli.algorithms.turns import split_turns
from gspo_cli.core.registry import Registry

# Per-token loss [B, T], mask [B, T] -> per-token contribution [B, T], summed by the caller.
TokenWeighting = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

LOSS_AGGREGATIONS: Registry[TokenWeighting] = Registry("loss aggregation")

# The paper's aggregation: mean over sequences of per-sequence token means.
DEFAULT_LOSS_AGG = "seq_mean_token_mean"


def _lengths(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def _seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return token_loss * mask / _lengths(mask)  # [B, T]; normalised by the number of sequences


@LOSS_AGGREGATIONS.register("token_mean")
def _token_mean(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return token_loss * mask  # [B, T]; normalised by the number of response tokens


@LOSS_AGGREGATIONS.register("seq_mean_token_sum")
def _seq_mean_token_sum(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return token_loss * mask  # [B, T]; normalised by the number of sequences


def loss_normalizer(mask: torch.Tensor, loss_agg: str, turns: torch.Tensor | None = None) -> float:
    """The denominator `aggregate` uses for this mask: sequences or response tokens. With
    `turns` (`[B, T]`, `sequence_unit: turn`) a sequence is one model turn of a response.

    Sum it over every micro-batch of an optimiser step and pass the total as `normalizer`.
    """
    LOSS_AGGREGATIONS.get(loss_agg)  # raises on unknown names
    if loss_agg == "token_mean":
        return float(mask.sum().item())
    if turns is not None:
        return float(len(split_turns(turns, mask)[0]))
    return float((mask.sum(dim=1) > 0).sum().item())


def aggregate(
    token_loss: torch.Tensor, mask: torch.Tensor, loss_agg: str, normalizer: float | None = None
) -> torch.Tensor:
    """Reduce per-token losses `[B, T]` to a 0-dim loss with the named aggregation."""
    weighted = LOSS_AGGREGATIONS.get(loss_agg)(token_loss, mask)  # [B, T]
    denominator = loss_normalizer(mask, loss_agg) if normalizer is None else normalizer
    return weighted.sum() / max(denominator, 1.0)
