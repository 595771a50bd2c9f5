"""Per-token KL estimators, KL(pi || pi_ref) from samples of pi, and the KL-in-reward penalty.

Every estimator maps `[B, T]` log-probs of the sampled tokens under pi and under the reference
to a `[B, T]` per-token estimate, with d = log pi_ref(y_t) - log pi(y_t) (J. Schulman,
"Approximating KL Divergence", joschu.net/blog/kl-approx.html). Masked positions hold anything;
callers mask them.

Two placements use them (`algorithm.kl_in`):
- loss: beta * k(log pi, log pi_ref) per token is added to the policy loss, with gradient
  (verl `use_kl_loss`, TRL `beta`).
- reward: each response's reward loses beta * sum_t k(log pi_old, log pi_ref), without
  gradient, before group advantages are taken (verl `use_kl_in_reward`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gspo_cli.algorithms.advantages import group_advantages
from gspo_cli.algorithms.losses import LOG_RATIO_CLAMP
from gspo_cli.core.registry import Registry

# (log pi `[B, T]`, log pi_ref `[B, T]`) -> per-token estimate `[B, T]`
KlEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KlEstimator] = Registry("kl estimator")

DEFAULT_KL_ESTIMATOR = "k3"

# verl's low_var_kl bounds (core_algos.py, kl_penalty_forward "low_var_kl").
LOW_VAR_KL_LOG_RATIO_CLAMP = 20.0
LOW_VAR_KL_VALUE_CLAMP = 10.0


@KL_ESTIMATORS.register("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = -d = log pi - log pi_ref: unbiased, high variance, can be negative (Schulman;
    verl "kl", the default of its KL-in-reward)."""
    return logprobs - ref_logprobs  # [B, T]


@KL_ESTIMATORS.register("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = d^2 / 2: biased, low variance, >= 0 (Schulman; verl "mse")."""
    return 0.5 * (ref_logprobs - logprobs).square()  # [B, T]


@KL_ESTIMATORS.register("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = e^d - 1 - d: unbiased, low variance, >= 0 (Schulman; TRL's `beta` term). d is
    clamped to +-LOG_RATIO_CLAMP (20) before exp so a corrupted sample cannot overflow."""
    d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    return d.exp() - d - 1.0


@KL_ESTIMATORS.register("low_var_kl")
def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """verl's low_var_kl (core_algos.py kl_penalty_forward, the default of its KL loss): k3 with
    d clamped to [-20, 20] and the result clamped to [-10, 10]."""
    d = (ref_logprobs - logprobs).clamp(-LOW_VAR_KL_LOG_RATIO_CLAMP, LOW_VAR_KL_LOG_RATIO_CLAMP)
    return (d.exp() - d - 1.0).clamp(-LOW_VAR_KL_VALUE_CLAMP, LOW_VAR_KL_VALUE_CLAMP)  # [B, T]


def token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """`[B, T]` the named estimator of KL(pi || pi_ref) per token."""
    return KL_ESTIMATORS.get(estimator)(logprobs, ref_logprobs)


@torch.no_grad()
def kl_reward_penalty(
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    coef: float,
) -> torch.Tensor:
    """`[N]` what KL-in-reward subtracts from each response's reward: coef * sum_t
    k(log pi_old, log pi_ref) over its response tokens (`mask` `[N, T]`), without gradient.
    The sum, not a mean: verl puts the KL on every token's reward and GRPO's outcome advantage
    sums the token rewards into the sequence's score."""
    kl = token_kl(old_logprobs.double(), ref_logprobs.double(), estimator)  # [N, T]
    return coef * (kl * mask.to(kl.dtype)).sum(dim=1)  # [N]


def kl_reward_advantages(
    rewards: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: str,
    coef: float,
    group_size: int,
    scale: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`[N]` group advantages of the KL-penalised rewards (`rewards` `[N]` minus
    `kl_reward_penalty`), and metrics: the mean penalty and the token-mean KL(pi_old || ref).

    Every gradient term stays a multiple of the advantage, so a group whose penalised rewards
    are all equal (e.g. G identical responses) still has advantage exactly 0 and can be skipped.
    """
    penalty = kl_reward_penalty(old_logprobs, ref_logprobs, mask, estimator, coef)  # [N]
    advantages = group_advantages(rewards.double() - penalty, group_size, scale=scale)  # [N]
    tokens = mask.sum().clamp(min=1)
    metrics = {
        "kl_reward_penalty": float(penalty.mean()),
        "kl": float(penalty.sum() / coef / tokens) if coef else 0.0,
    }
    return advantages, metrics
