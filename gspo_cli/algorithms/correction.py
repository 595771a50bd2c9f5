"""Rollout corrections: importance weights for the mismatch between the engine that sampled the
responses (e.g. vLLM, other kernels and precision) and the trainer's pi_old.

rho_t = pi_old(y_t) / pi_engine(y_t), from the trainer's recomputed log-probs and the engine's.

- `token_tis`: truncated importance sampling (Yao et al., 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"): each token's loss is weighted by min(rho_t, C).
- `seq_mask`: the sequence-level geometric mean rho_i = exp(mean_t log rho_t), the same length
  normalisation as GSPO's s_i (Eq. 7); sequences with rho_i outside [1/C, C] are dropped from
  the loss and from its normaliser (masked importance sampling, as in Liu et al., 2025, "When
  Speed Kills Stability", and verl's rollout correction).
- `seq_truncate`: each sequence's tokens weighted by min(rho_i, C).

Weights carry no gradient. Shapes: `[B, T]` in, `[B, T]` out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from gspo_cli.algorithms.losses import LOG_RATIO_CLAMP, sequence_log_ratio
from gspo_cli.core.registry import Registry


class Correction(NamedTuple):
    weights: torch.Tensor  # [B, T] multiplies each token's policy loss
    keep: torch.Tensor  # [B, T] 1 where the token stays in the loss and its normaliser


CorrectionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Correction]
ROLLOUT_CORRECTIONS: Registry[CorrectionFn] = Registry("rollout correction")


def _log_rho(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((old - engine) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]


@ROLLOUT_CORRECTIONS.register("off")
def no_correction(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cap: float
) -> Correction:
    return Correction(torch.ones_like(mask), mask.clone())


@ROLLOUT_CORRECTIONS.register("token_tis")
def token_tis(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cap: float
) -> Correction:
    weights = _log_rho(old, engine, mask).exp().clamp(max=cap) * mask  # [B, T]
    return Correction(weights.detach(), mask.clone())


def _sequence_rho(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    log_rho = sequence_log_ratio(old, engine, mask)  # [B]
    return log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]


@ROLLOUT_CORRECTIONS.register("seq_mask")
def seq_mask(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cap: float) -> Correction:
    rho = _sequence_rho(old, engine, mask)  # [B]
    inside = ((rho >= 1.0 / cap) & (rho <= cap)).to(mask.dtype)  # [B]
    return Correction(torch.ones_like(mask), mask * inside.unsqueeze(1))


@ROLLOUT_CORRECTIONS.register("seq_truncate")
def seq_truncate(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cap: float
) -> Correction:
    rho = _sequence_rho(old, engine, mask).clamp(max=cap)  # [B]
    return Correction((rho.unsqueeze(1) * mask).detach(), mask.clone())


def rollout_correction(
    name: str, old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cap: float
) -> Correction:
    """The named correction of `[B, T]` log-probs (trainer pi_old vs engine) under `mask`."""
    return ROLLOUT_CORRECTIONS.get(name)(old.detach(), engine.detach(), mask, cap)


def mismatch_metrics(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, clip_low: float, clip_high: float
) -> dict[str, float]:
    """Engine vs trainer on the same tokens: |delta log p| per token, and the sequence log-ratio
    log s_i = mean_t (log pi_old - log pi_engine) with the share of sequences whose s_i already
    lies outside the clip window [1 - eps_low, 1 + eps_high] before any update."""
    diff = ((old - engine) * mask).detach()  # [B, T]
    tokens = mask.sum().clamp(min=1)
    log_s = sequence_log_ratio(old.detach(), engine.detach(), mask)  # [B]
    s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    outside = (s < 1 - clip_low) | (s > 1 + clip_high)
    return {
        "mismatch_token_abs_mean": float(diff.abs().sum() / tokens),
        "mismatch_token_abs_max": float(diff.abs().max()) if diff.numel() else 0.0,
        "mismatch_seq_log_ratio_mean": float(log_s.mean()),
        "mismatch_seq_log_ratio_abs_max": float(log_s.abs().max()),
        "mismatch_outside_clip_frac": float(outside.float().mean()),
    }
