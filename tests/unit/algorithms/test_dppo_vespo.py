"""DPPO (arXiv 2602.04879) and VESPO (arXiv 2602.10693) by hand: the trust region drops a
token's term only when the update left it in its advantage's direction; VESPO's kernel is 1 on
policy (REINFORCE) and reshapes an unnormalised sequence weight. Their float64 loop references
on every aggregation and on tool trajectories run in test_tool_loss.py and test_icepop.py
(tests/support/loss_reference.py)."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.algorithms import LossOptions, compute_policy_loss
from gspo_cli.algorithms.losses.dppo import bernoulli_kl, dppo_kl_loss, dppo_tv_loss
from gspo_cli.algorithms.losses.vespo import vespo_loss, vespo_weights
from gspo_cli.recipe import RecipeError, load_recipe
from tests.support.loss_cases import CLIPS, sequence_advantages, tool_batch

Tensor = torch.Tensor
LOG = math.log


def one_token(p: float, q: float) -> tuple[Tensor, Tensor, Tensor]:
    """[1, 1] log pi (grad), log pi_old, mask for a token whose probability moved q -> p."""
    lp = torch.tensor([[LOG(p)]], dtype=torch.float64, requires_grad=True)
    return lp, torch.tensor([[LOG(q)]], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64)


@pytest.mark.parametrize(
    "p,q,advantage,dropped",
    [
        (0.7, 0.5, 1.0, True),  # up by 0.2 > 0.15, pushed up: out of the region
        (0.7, 0.5, -1.0, False),  # up, but the advantage pulls it down: kept
        (0.3, 0.5, -1.0, True),  # down by 0.2, pushed down: out
        (0.6, 0.5, 1.0, False),  # up by 0.1 < 0.15: inside
    ],
)
def test_dppo_tv_drops_a_token_only_past_the_region_in_its_advantages_direction(
    p: float, q: float, advantage: float, dropped: bool
) -> None:
    lp, old, mask = one_token(p, q)
    adv = torch.tensor([[advantage]], dtype=torch.float64)
    out = dppo_tv_loss(lp, old, adv, mask, 0.15, 0.15)
    (grad,) = torch.autograd.grad(out.loss.sum(), lp)
    if dropped:
        assert (
            float(out.loss.detach()) == 0
            and float(grad) == 0
            and int(out.clipped) == (1 if advantage > 0 else -1)
        )
    else:  # -r A, gradient -A r d log pi
        assert float(out.loss.detach()) == pytest.approx(-advantage * p / q)
        assert float(grad) == pytest.approx(-advantage * p / q)


def test_dppo_kl_uses_the_bernoulli_kl_of_the_sampled_token() -> None:
    lp, old, mask = one_token(0.7, 0.5)
    kl = float(bernoulli_kl(old, lp.detach()))
    assert kl == pytest.approx(0.5 * LOG(0.5 / 0.7) + 0.5 * LOG(0.5 / 0.3))  # 0.0872
    adv = torch.ones(1, 1, dtype=torch.float64)
    assert float(dppo_kl_loss(lp, old, adv, mask, 0.05, 0.05).loss) == 0  # 0.087 > 0.05, up
    assert float(dppo_kl_loss(lp, old, adv, mask, 0.05, 0.1).loss) == pytest.approx(-1.4)
    near_one = torch.tensor([[-1e-30]], dtype=torch.float64)  # p rounds to 1: finite
    assert math.isfinite(float(bernoulli_kl(near_one, torch.tensor([[LOG(0.9)]]).double())))


@pytest.mark.parametrize("algo", ["dppo_tv", "dppo_kl"])
def test_the_reference_cases_drop_some_tokens_and_keep_others(algo: str) -> None:
    dropped = kept = 0
    for seed in (0, 1):
        lp, old, adv, mask = tool_batch(seed)
        adv = sequence_advantages(adv, mask, algo)
        loss = dppo_tv_loss if algo == "dppo_tv" else dppo_kl_loss
        out = loss(lp, old, adv, mask, *CLIPS[algo])
        dropped += int(((out.clipped != 0) & (mask > 0)).sum())
        kept += int(((out.clipped == 0) & (mask > 0) & (adv != 0)).sum())
    assert dropped > 0 and kept > dropped  # the loop references see both kinds


def test_vespo_is_reinforce_on_policy_and_reshapes_the_sequence_weight() -> None:
    lp = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    phi, w = vespo_weights(lp, lp.detach(), adv, mask, LossOptions())
    assert torch.equal(phi, torch.ones(2, dtype=torch.float64)) and torch.equal(w, torch.ones(2))
    old = lp.detach() - 0.25  # each token's ratio e^0.25: W = e^0.5, no 1/|y|
    phi, _ = vespo_weights(lp, old, adv, mask, LossOptions())
    w0 = math.exp(0.5)
    expected = [w0**2 * math.exp(3 * (1 - w0)), w0**3 * math.exp(2 * (1 - w0))]
    assert phi.tolist() == pytest.approx(expected)
    out = vespo_loss(lp, old, adv, mask, 0.2, 0.2)
    (grad,) = torch.autograd.grad(out.loss.sum(), lp)
    want = torch.tensor([[-expected[0]] * 2, [expected[1]] * 2], dtype=torch.float64)
    torch.testing.assert_close(grad, want)  # -phi A on every token
    far = vespo_weights(lp, lp.detach() - 30.0, adv, mask, LossOptions())[0]  # W = e^20
    assert torch.equal(far, torch.zeros(2, dtype=torch.float64))  # e^(-3 e^20): 0, finite


def test_vespo_takes_the_token_mean_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.yaml"
    path.write_text("algorithm: {name: vespo, loss_agg: seq_mean_token_mean}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert any("vespo supports loss_agg token_mean only" in p for p in info.value.problems)
    path.write_text("algorithm: {name: vespo, vespo_k_pos: 1.5}\n")
    algo = load_recipe(path).algorithm
    assert algo.loss_agg == "token_mean" and algo.loss_options().vespo_k_pos == 1.5
    lp, old, mask = one_token(0.7, 0.5)
    loss, metrics = compute_policy_loss(
        lp, old, torch.ones(1, 1).double(), mask, algorithm="vespo", clip_low=0.2,
        clip_high=0.2, loss_agg="token_mean",
    )  # fmt: skip
    assert metrics["clip_frac"] == 0.0 and math.isfinite(float(loss.detach()))
