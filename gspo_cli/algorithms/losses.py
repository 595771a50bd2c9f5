"""Policy losses: GSPO (Eq. 5, 7), GSPO-token (Eq. 13, 14) and GRPO (Eq. 2).

Its successors (LUSPO, SAPO, GMPO, CISPO) live in `successors.py`, in the same registry.

Every loss maps `[B, T]` log-probs to a per-token loss `[B, T]` (to minimise) plus the ratio
each token's clip decision was taken on. `compute_policy_loss` aggregates and adds metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from gspo_cli.algorithms.aggregation import DEFAULT_LOSS_AGG, LOSS_AGGREGATIONS
from gspo_cli.core.registry import Registry

# Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp: a stale or corrupted
# sample (log-ratio of hundreds) would otherwise give inf ratios and NaN gradients. exp(20) ~ 5e8
# is far outside any clip range. With a positive advantage the clip already holds such a ratio
# flat, so the clamp changes nothing. With a negative advantage it does: the pessimistic min
# keeps the unclipped term r * A for any r above 1 + eps_high, so past the clamp that term is
# exp(20) * A instead of r * A, and its gradient is 0 (the clamp's) instead of growing with r.
# Such a sample is broken rather than learnable; dropping its gradient is the intended guard.
LOG_RATIO_CLAMP = 20.0


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


POLICY_LOSSES: Registry[PolicyLoss] = Registry("algorithm")

# The papers' clip ranges (eps_low, eps_high), used when a recipe leaves them unset:
# GSPO section 5.1 (3e-4 / 4e-4, sequence ratios sit close to 1); GRPO with DAPO's clip-higher.
# Successors (see successors.py): LUSPO section 4 (2e-3 / 2.5e-3); GMPO Table 5, 0.4 each way
# in LOG space; CISPO: eps_low 1 is "no lower bound" (r > 0), eps_high 0.2 as verl's example
# (the paper gives none); SAPO has no hard clip: its loss ignores the pair (clip fractions
# read 0), which only sets the window of the engine-mismatch metric.
PAPER_CLIP: dict[str, tuple[float, float]] = {
    "gspo": (3e-4, 4e-4),
    "gspo_token": (3e-4, 4e-4),
    "grpo": (0.2, 0.27),
    "luspo": (2e-3, 2.5e-3),
    "sapo": (0.2, 0.2),
    "gmpo": (0.4, 0.4),
    "cispo": (1.0, 0.2),
}
# Losses with a soft gate instead of a hard clip: clip_low/clip_high are unused (a recipe based on
# a clipped one may carry them), and summaries show the gate instead.
NO_HARD_CLIP = frozenset({"sapo"})

# Aggregations other than the default that a paper uses: CISPO normalises by all tokens (Eq. 4).
PAPER_LOSS_AGG: dict[str, str] = {"cispo": "token_mean"}

# Losses that make sense under one aggregation only: LUSPO's |y_i| factor is written for
# seq_mean_token_mean; token_mean or a token sum would weigh each sequence by |y_i|^2.
ONLY_LOSS_AGG: dict[str, str] = {"luspo": "seq_mean_token_mean"}

# Losses whose importance ratio is one length-normalised ratio per sequence (no token ratio):
# pi_old may come from the rollout engine's likelihoods (GSPO section 5.4). GSPO-token keeps a
# per-token ratio and GRPO is token-level, so both need the trainer's own pi_old. LUSPO's ratio
# is GSPO's; GMPO's per-token clip makes its ratio token-level.
SEQUENCE_RATIO_LOSSES = frozenset({"gspo", "luspo"})


def resolve_loss_agg(algorithm: str, loss_agg: str | None) -> str:
    """The aggregation `algorithm` runs with: `loss_agg`, or its paper's when None.

    Raises UnknownNameError for an unregistered aggregation and ValueError for one the
    algorithm does not support.
    """
    only = ONLY_LOSS_AGG.get(algorithm)
    paper = only or PAPER_LOSS_AGG.get(algorithm, DEFAULT_LOSS_AGG)
    agg = paper if loss_agg is None else loss_agg
    LOSS_AGGREGATIONS.get(agg)  # an unknown name raises, listing the known ones
    if only is not None and agg != only:
        raise ValueError(f"{algorithm} supports loss_agg {only} only (its paper's), not {agg}")
    return agg


def _clipped_objective(
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


@POLICY_LOSSES.register("gspo")
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
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """GRPO, Eq. 2: a ratio w_it and a clip per token."""
    w = token_ratio(logprobs, old_logprobs)  # [B, T]
    return TokenLoss(_clipped_objective(w, advantages, clip_low, clip_high), w.detach())
