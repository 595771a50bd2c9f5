"""Rollout corrections and engine-vs-trainer mismatch metrics, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.algorithms import (
    ROLLOUT_CORRECTIONS,
    CorrectionLimits,
    compute_policy_loss,
    mismatch_metrics,
    rollout_correction,
)

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ENGINE = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
# Trainer pi_old: sequence 0 agrees on average (log rho = +0.3, -0.3, 0), sequence 1 sits far
# above the engine (log rho = 1.5 on both tokens).
OLD = ENGINE + torch.tensor([[0.3, -0.3, 0.0], [1.5, 1.5, 0.0]])
LIMITS = CorrectionLimits(cap=2.0, band=(0.5, 5.0))


def test_every_correction_is_registered() -> None:
    assert ROLLOUT_CORRECTIONS.names() == [
        "icepop", "off", "seq_mask", "seq_truncate", "token_tis",
    ]  # fmt: skip


def test_token_tis_caps_each_tokens_ratio() -> None:
    weights, keep = rollout_correction("token_tis", OLD, ENGINE, MASK, LIMITS)
    expected = torch.tensor([[math.exp(0.3), math.exp(-0.3), 1.0], [2.0, 2.0, 0.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert torch.equal(keep, MASK)


def test_seq_mask_drops_sequences_whose_geometric_mean_ratio_leaves_the_band() -> None:
    weights, keep = rollout_correction("seq_mask", OLD, ENGINE, MASK, LIMITS)
    assert torch.equal(weights, torch.ones_like(MASK))
    assert torch.equal(keep, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))  # e^1.5 > 2


def test_seq_truncate_weighs_each_sequence_by_its_capped_ratio() -> None:
    weights, _ = rollout_correction("seq_truncate", OLD, ENGINE, MASK, LIMITS)
    assert torch.allclose(weights, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]), atol=1e-6)


def test_mismatch_metrics() -> None:
    m = mismatch_metrics(OLD, ENGINE, MASK, clip_low=0.2, clip_high=0.27)
    assert m["mismatch_token_abs_mean"] == pytest.approx((0.3 + 0.3 + 0 + 1.5 + 1.5) / 5)
    assert m["mismatch_token_abs_max"] == pytest.approx(1.5)
    assert m["mismatch_seq_log_ratio_mean"] == pytest.approx((0.0 + 1.5) / 2)
    assert m["mismatch_outside_clip_frac"] == 0.5  # e^1.5 lies outside [0.8, 1.27]


def test_token_weights_scale_the_policy_loss() -> None:
    lp = torch.randn(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    kwargs = {"algorithm": "grpo", "clip_low": 0.2, "clip_high": 0.27, "loss_agg": "token_mean"}
    plain, _ = compute_policy_loss(lp, lp.detach(), adv, MASK, **kwargs)
    doubled, _ = compute_policy_loss(
        lp, lp.detach(), adv, MASK, token_weights=2 * torch.ones_like(MASK), **kwargs
    )
    assert doubled.item() == pytest.approx(2 * plain.item())
