"""`LossSpec`: what the recipe and the step ask of a policy loss, and `LOSS_SPECS`, the one
registry of losses by name. Each family's module registers its spec next to its function.

Every loss maps `[B, T]` log-probs to a per-token loss `[B, T]` (to minimise) plus the ratio
each token's clip decision was taken on. `compute_policy_loss` aggregates and adds metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from gspo_cli.algorithms.aggregation import DEFAULT_LOSS_AGG, LOSS_AGGREGATIONS
from gspo_cli.core.registry import Registry


class TokenLoss(NamedTuple):
    loss: torch.Tensor  # [B, T] per-token loss to minimise (masked positions are ignored later)
    ratio: torch.Tensor  # [B, T] the ratio each token's clip decision used (no grad needed)
    # [B, T] +1 where the upper bound changed the token's gradient, -1 the lower, 0 neither.
    # None: the PPO rule on `ratio` (above 1+eps_high with A > 0, below 1-eps_low with A < 0).
    clipped: torch.Tensor | None = None


@dataclass(frozen=True)
class LossOptions:
    """Knobs a loss needs beyond the clip range; each loss reads only its own."""

    sapo_tau_pos: float = 1.0  # SAPO gate temperature for A > 0 (arXiv 2511.20347)
    sapo_tau_neg: float = 1.05  # ... for A <= 0: negative-advantage tokens decay faster
    vespo_k_pos: float = 2.0  # VESPO's kernel W^k e^{lambda (1 - W)} for A >= 0 (c1, c2) ...
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0  # ... and for A < 0 (TRL's and the authors' defaults)
    vespo_lambda_neg: float = 2.0


DEFAULT_LOSS_OPTIONS = LossOptions()


class PolicyLoss(Protocol):
    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        clip_low: float,
        clip_high: float,
        /,
        *,
        options: LossOptions,
    ) -> TokenLoss: ...


@dataclass(frozen=True)
class LossSpec:
    """One policy loss as the recipe and the step see it; its paper's values are the defaults
    a recipe gets when it leaves them unset."""

    loss: PolicyLoss
    # The paper's (eps_low, eps_high), taken when a recipe leaves clip_low / clip_high unset.
    paper_clip: tuple[float, float]
    # False for a soft gate instead of a hard clip: clip_low / clip_high are unused (a recipe
    # based on a clipped loss may carry them), and summaries show the gate instead.
    hard_clip: bool = True
    # The aggregation the paper uses, taken when a recipe leaves loss_agg unset.
    paper_loss_agg: str = DEFAULT_LOSS_AGG
    # The aggregations that make sense for the loss; None: any registered one.
    loss_aggs: frozenset[str] | None = None
    # True when the importance ratio is one length-normalised ratio per sequence (no token
    # ratio): pi_old may then come from the rollout engine's likelihoods (GSPO section 5.4).
    sequence_ratio: bool = False

    def __post_init__(self) -> None:
        low, high = self.paper_clip
        if low <= 0 or high <= 0:
            raise ValueError(f"paper clip ranges must be positive, got {low}, {high}")
        for agg in (self.paper_loss_agg, *sorted(self.loss_aggs or ())):
            LOSS_AGGREGATIONS.get(agg)  # an unknown name raises, listing the known ones
        if self.loss_aggs is not None and self.paper_loss_agg not in self.loss_aggs:
            raise ValueError(f"paper_loss_agg {self.paper_loss_agg} is not among {self.loss_aggs}")


LOSS_SPECS: Registry[LossSpec] = Registry("algorithm")


def resolve_loss_agg(algorithm: str, loss_agg: str | None) -> str:
    """The aggregation `algorithm` runs with: `loss_agg`, or its paper's when None.

    Raises UnknownNameError for an unregistered algorithm or aggregation and ValueError for an
    aggregation the algorithm does not support.
    """
    spec = LOSS_SPECS.get(algorithm)
    agg = spec.paper_loss_agg if loss_agg is None else loss_agg
    LOSS_AGGREGATIONS.get(agg)  # an unknown name raises, listing the known ones
    if spec.loss_aggs is not None and agg not in spec.loss_aggs:
        allowed = " or ".join(sorted(spec.loss_aggs))
        paper = " (its paper's)" if spec.loss_aggs == {spec.paper_loss_agg} else ""
        raise ValueError(f"{algorithm} supports loss_agg {allowed} only{paper}, not {agg}")
    return agg
