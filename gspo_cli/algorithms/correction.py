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
- `icepop`: IcePop (Ling Team, Ring-1T, arXiv 2510.18855): each token is weighted by rho_t
  inside the band [alpha, beta] and by 0 outside it: a token the two engines disagree on that
  much leaves the gradient, and stays in the length normaliser as in the paper's objective
  (slime's `icepop_function` does the same). The paper's band is [0.5, 5]; it reports about
  0.1-0.2% of tokens masked there, and instability with [0.5, 2].

The correction is a factor of its own, apart from the loss's ratio pi_theta / pi_old (GSPO's
length-normalised s_i): the loss never multiplies the two into one exp(sum) that would
underflow at long lengths. Its aggregation is its own too: per token (`token_tis`, `icepop`) or
the sequence's geometric mean (`seq_mask`, `seq_truncate`); the plain product over the sequence
is not offered (exp of a sum of thousands of log-ratios is 0 or inf in float32).

Weights carry no gradient. Shapes: `[B, T]` in, `[B, T]` out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from gspo_cli.algorithms.losses import LOG_RATIO_CLAMP, sequence_log_ratio
from gspo_cli.core.registry import Registry


class Correction(NamedTuple):
    weights: torch.Tensor  # [B, T] multiplies each token's policy loss
    keep: torch.Tensor  # [B, T] 1 where the token stays in the loss and its normaliser


class CorrectionLimits(NamedTuple):
    cap: float  # C of token_tis, seq_mask, seq_truncate
    band: tuple[float, float]  # [alpha, beta] of icepop


CorrectionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, CorrectionLimits], Correction]
ROLLOUT_CORRECTIONS: Registry[CorrectionFn] = Registry("rollout correction")


def _log_rho(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((old - engine) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]


@ROLLOUT_CORRECTIONS.register("off")
def no_correction(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, limits: CorrectionLimits
) -> Correction:
    return Correction(torch.ones_like(mask), mask.clone())


@ROLLOUT_CORRECTIONS.register("token_tis")
def token_tis(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, limits: CorrectionLimits
) -> Correction:
    weights = _log_rho(old, engine, mask).exp().clamp(max=limits.cap) * mask  # [B, T]
    return Correction(weights.detach(), mask.clone())


def _sequence_rho(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    log_rho = sequence_log_ratio(old, engine, mask)  # [B]
    return log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]


@ROLLOUT_CORRECTIONS.register("seq_mask")
def seq_mask(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, limits: CorrectionLimits
) -> Correction:
    cap = limits.cap
    rho = _sequence_rho(old, engine, mask)  # [B]
    inside = ((rho >= 1.0 / cap) & (rho <= cap)).to(mask.dtype)  # [B]
    return Correction(torch.ones_like(mask), mask * inside.unsqueeze(1))


@ROLLOUT_CORRECTIONS.register("seq_truncate")
def seq_truncate(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, limits: CorrectionLimits
) -> Correction:
    rho = _sequence_rho(old, engine, mask).clamp(max=limits.cap)  # [B]
    return Correction((rho.unsqueeze(1) * mask).detach(), mask.clone())


@ROLLOUT_CORRECTIONS.register("icepop")
def icepop(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, limits: CorrectionLimits
) -> Correction:
    alpha, beta = limits.band
    log_rho = _log_rho(old, engine, mask)  # [B, T]
    # compared in log space: a ratio that overflows exp() is outside any band all the same
    inside = (log_rho >= math.log(alpha)) & (log_rho <= math.log(beta))  # [B, T]
    weights = torch.where(inside, log_rho.exp(), torch.zeros_like(log_rho)) * mask  # [B, T]
    return Correction(weights.detach(), mask.clone())


def rollout_correction(
    name: str,
    old: torch.Tensor,
    engine: torch.Tensor,
    mask: torch.Tensor,
    limits: CorrectionLimits,
) -> Correction:
    """The named correction of `[B, T]` log-probs (trainer pi_old vs engine) under `mask`."""
    return ROLLOUT_CORRECTIONS.get(name)(old.detach(), engine.detach(), mask, limits)


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
