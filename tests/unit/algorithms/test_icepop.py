"""IcePop (`algorithm.rollout_correction: icepop`; Ling Team, "Every Step Evolves: Scaling RL
for Trillion-Scale Thinking Model" (Ring-1T), arXiv 2510.18855, the IcePop objective): each
token's loss term is weighted by M(k_t), k_t = pi_train(y_t; theta_old) / pi_infer(y_t;
theta_old), M(k) = k inside [alpha, beta] and 0 outside, under the paper's 1/|y_i| (masked
tokens stay in the normaliser). Checked against a float64 loop written from that objective for
every loss and aggregation, on tool trajectories with zero-advantage rows; and the correction
stays a factor apart from GSPO's ratio, finite at 4,096 tokens."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.algorithms import CorrectionLimits, LossOptions, compute_policy_loss
from gspo_cli.algorithms.correction import rollout_correction
from tests.support.loss_cases import CASES, CLIPS, sequence_advantages, tool_batch
from tests.support.loss_reference import TAUS, reference_loss

Tensor = torch.Tensor
BAND = (0.5, 5.0)  # Ring-1T's
LIMITS = CorrectionLimits(cap=2.0, band=BAND)


def engine_logprobs(old: Tensor, mask: Tensor, seed: int) -> Tensor:
    """The sampler's log-probs: pi_old's with engine noise, some tokens far off (outside the
    band on either side: k < 0.5 or k > 5)."""
    g = torch.Generator().manual_seed(100 + seed)
    noise = torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.3
    far = torch.rand(old.shape, generator=g, dtype=torch.float64)
    noise = torch.where(far < 0.1, torch.full_like(noise, 2.0), noise)  # k = e^-2 < 0.5
    noise = torch.where(far > 0.9, torch.full_like(noise, -1.7), noise)  # k = e^1.7 > 5
    return torch.where(mask > 0, old - noise, old)


def paper_weights(old: Tensor, engine: Tensor, mask: Tensor, band: tuple[float, float]) -> Tensor:
    """M(k_t) one token at a time, as the paper writes it."""
    alpha, beta = band
    w = torch.zeros_like(old)
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if mask[i, t] > 0:
                k = math.exp(float(old[i, t]) - float(engine[i, t]))
                w[i, t] = k if alpha <= k <= beta else 0.0
    return w


def test_icepop_keeps_the_ratio_inside_the_band_and_zero_outside() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    engine = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    old = engine + torch.tensor([[0.3, 1.7, -0.8, 9.0]])  # k: 1.35, 5.47, 0.45, (padding)
    weights, keep = rollout_correction("icepop", old, engine, mask, LIMITS)
    assert torch.allclose(weights, torch.tensor([[math.exp(0.3), 0.0, 0.0, 0.0]]))
    assert torch.equal(keep, mask)  # in the normaliser still
    wide = CorrectionLimits(cap=2.0, band=(0.4, 6.0))
    weights, _ = rollout_correction("icepop", old, engine, mask, wide)
    inside = [math.exp(0.3), math.exp(1.7), math.exp(-0.8), 0.0]
    assert torch.allclose(weights, torch.tensor([inside]))


@pytest.mark.parametrize("algo,agg", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_icepop_on_every_loss_is_the_papers_objective(algo: str, agg: str, seed: int) -> None:
    lp, old, adv, mask = tool_batch(seed)
    adv[1] = 0.0  # a zero-advantage row
    adv = sequence_advantages(adv, mask, algo)
    engine = engine_logprobs(old, mask, seed)
    weights, keep = rollout_correction("icepop", old, engine, mask, LIMITS)
    expected_w = paper_weights(old, engine, mask, BAND)
    assert torch.allclose(weights, expected_w, rtol=1e-12, atol=0)
    masked = int(((expected_w == 0) & (mask > 0)).sum())
    assert 0 < masked < int(mask.sum())  # both kinds of token are in the case
    low, high = CLIPS[algo]
    x = lp.detach().clone().requires_grad_(True)
    loss, _ = compute_policy_loss(
        x, old, adv, keep, algorithm=algo, clip_low=low, clip_high=high, loss_agg=agg,
        options=LossOptions(*TAUS), token_weights=weights,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, x)
    y = lp.detach().clone().requires_grad_(True)
    ref = reference_loss(y, old, adv, mask, algo, low, high, agg, w=expected_w)
    (ref_grad,) = torch.autograd.grad(ref, y)
    assert abs(loss.item() - ref.item()) < 1e-10
    assert torch.allclose(grad, ref_grad, rtol=0, atol=1e-10)
    outside = (expected_w == 0) & (mask > 0)
    if algo not in ("gspo", "luspo", "gmpo"):  # token-level ratios: a masked token is inert
        assert torch.all(grad[outside] == 0)


def test_the_correction_is_apart_from_gspos_ratio_and_finite_at_4096_tokens() -> None:
    """GSPO's s_i = exp(mean log pi_theta/pi_old) and the correction (here the sequence's
    geometric-mean IS weight, seq_truncate, and icepop's per-token weights) are separate
    factors: at 4,096 tokens the plain product of the engine ratios is exp(-123), 0 in float32,
    while ours stays finite in float32 and equals the float64 loop."""
    g = torch.Generator().manual_seed(7)
    b, t = 2, 4096
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    engine = old + 0.03 + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.05
    lp = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 1e-3
    mask = torch.ones(b, t, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    log_product = float((old - engine).sum(1)[0])  # the product over the sequence, in logs
    assert log_product < -110 and math.exp(log_product) > 0
    assert float(torch.exp(torch.tensor(log_product, dtype=torch.float32))) == 0.0
    for name in ("seq_truncate", "icepop"):
        for dtype in (torch.float64, torch.float32):
            o, e, m = old.to(dtype), engine.to(dtype), mask.to(dtype)
            weights, keep = rollout_correction(name, o, e, m, LIMITS)
            x = lp.to(dtype).clone().requires_grad_(True)
            loss, _ = compute_policy_loss(
                x, o, adv.to(dtype), keep, algorithm="gspo", clip_low=3e-4, clip_high=4e-4,
                loss_agg="seq_mean_token_mean", token_weights=weights,
            )  # fmt: skip
            (grad,) = torch.autograd.grad(loss, x)
            assert torch.isfinite(loss) and torch.isfinite(grad).all()
            if name == "seq_truncate":  # one weight per sequence: exp(mean log rho_t)
                rho = [math.exp(float((old - engine)[i].mean())) for i in range(b)]
                expected = torch.tensor(rho, dtype=torch.float64).unsqueeze(1).expand(b, t)
            else:
                expected = paper_weights(old, engine, mask, BAND)
            y = lp.clone().requires_grad_(True)
            ref = reference_loss(y, old, adv.unsqueeze(1).expand(b, t), mask, "gspo",
                                 3e-4, 4e-4, "seq_mean_token_mean", w=expected)  # fmt: skip
            tol = 1e-10 if dtype == torch.float64 else 1e-5
            assert abs(loss.item() - ref.item()) < tol, (name, dtype)
