"""LUSPO, SAPO, GMPO and CISPO against loops written straight from their papers' equations.

The references run one response and one token at a time in float64 and share no code with
gspo_cli (docs: ../shared/docs/algorithms.md sections 2-5, docs/options/successor-losses.md).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from gspo_cli.algorithms import LOSS_SPECS, LossOptions, compute_policy_loss
from gspo_cli.recipe import RecipeError, load_recipe
from tests.support.helpers import REPO, invoke_cli
from tests.support.loss_reference import TAUS, reference_loss

Tensor = torch.Tensor
SUCCESSORS = ["luspo", "sapo", "gmpo", "cispo"]
AGGS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"]
# Clip ranges for the random tests: wide enough that the references' clip branches run.
CLIPS = {"luspo": (0.01, 0.012), "sapo": (0.2, 0.2), "gmpo": (0.3, 0.3), "cispo": (0.2, 0.28)}


Batch = tuple[Tensor, Tensor, Tensor, Tensor]  # lp (grad), old, adv, mask: each [B, T]


def random_batch(seed: int, b: int, t: int, *, per_token_adv: bool, scale: float = 0.4) -> Batch:
    """float64 log-probs with a prompt prefix, a response of random length and padding; the
    padding holds garbage that must not matter. Some sequences get a zero advantage."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(b, t, generator=g, dtype=torch.float64) * scale
    mask = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        start = int(torch.randint(0, t // 2, (1,), generator=g))
        length = int(torch.randint(1, t - start + 1, (1,), generator=g))
        mask[i, start : start + length] = 1
    lp = torch.where(mask > 0, lp, torch.full_like(lp, 30.0)).requires_grad_(True)
    adv = torch.randn(b, t if per_token_adv else 1, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    return lp, old, adv.expand(b, t).contiguous(), mask


def _loss_and_grad(
    lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, algo: str, **kw: Any
) -> tuple[Tensor, Tensor, dict[str, float]]:
    x = lp.detach().clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(x, old, adv, mask, algorithm=algo, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    return loss, grad, metrics


SUPPORTED = [(a, g) for a, g in itertools.product(SUCCESSORS, AGGS) if a != "luspo"]
SUPPORTED.append(("luspo", "seq_mean_token_mean"))


@pytest.mark.parametrize("algo,agg,seed", [(a, g, s) for a, g in SUPPORTED for s in (0, 1, 2)])
def test_matches_loop_reference_in_value_and_gradient(algo: str, agg: str, seed: int) -> None:
    lo, hi = CLIPS[algo]
    b, t = 4 + seed, 5 + 3 * seed
    lp, old, adv, mask = random_batch(
        seed, b, t, per_token_adv=algo in ("sapo", "cispo"), scale=0.05 if algo == "luspo" else 0.4
    )
    loss, grad, metrics = _loss_and_grad(
        lp,
        old,
        adv,
        mask,
        algo,
        clip_low=lo,
        clip_high=hi,
        loss_agg=agg,
        options=LossOptions(*TAUS),
    )
    lp_ref = lp.detach().clone().requires_grad_(True)
    ref = reference_loss(lp_ref, old, adv, mask, algo, lo, hi, agg)
    (grad_ref,) = torch.autograd.grad(ref, lp_ref)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-6, atol=1e-6)
    if algo != "sapo" and seed > 0:  # the clip branches of the reference really ran
        assert metrics["clip_frac"] > 0


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_sum"])
def test_luspo_refuses_aggregations_that_square_the_length(agg: str, tmp_path: Path) -> None:
    lp, old, adv, mask = random_batch(0, 3, 5, per_token_adv=False)
    with pytest.raises(ValueError, match="luspo supports loss_agg seq_mean_token_mean only"):
        compute_policy_loss(
            lp, old, adv, mask, algorithm="luspo", clip_low=0.1, clip_high=0.1, loss_agg=agg
        )
    path = tmp_path / "r.yaml"
    path.write_text(f"algorithm: {{name: luspo, loss_agg: {agg}}}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert any("luspo supports loss_agg seq_mean_token_mean only" in p for p in info.value.problems)


# --- GMPO (spec section 2) -------------------------------------------------------------------


def test_gmpo_equal_log_ratios_give_a_times_e_to_the_c() -> None:
    c = 0.25  # inside the paper's log range 0.4
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    old = -torch.rand(3, 4, dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, 2.0], dtype=torch.float64)
    loss, _, _ = _loss_and_grad(old + c, old, adv, mask, "gmpo", clip_low=0.4, clip_high=0.4)
    assert loss.item() == pytest.approx(-(adv * math.exp(c)).mean().item(), rel=1e-12)


def test_gmpo_without_clipping_equals_gspo_with_infinite_clip() -> None:
    lp, old, adv, mask = random_batch(4, 6, 9, per_token_adv=False, scale=0.1)
    assert ((lp - old).abs() * mask).max() < 0.4  # no token reaches GMPO's clip
    gmpo = _loss_and_grad(lp, old, adv, mask, "gmpo", clip_low=0.4, clip_high=0.4)
    gspo = _loss_and_grad(lp, old, adv, mask, "gspo", clip_low=1e9, clip_high=1e9)
    torch.testing.assert_close(gmpo[0], gspo[0])
    torch.testing.assert_close(gmpo[1], gspo[1])
    assert gmpo[2]["clip_frac"] == 0


def test_gmpo_clips_one_token_not_the_sequence() -> None:
    log_r = torch.tensor([[1.0, 0.3, 0.3], [1.0, 0.3, 0.3]], dtype=torch.float64)  # mean 0.53
    old, mask = torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    _, grad, metrics = _loss_and_grad(log_r, old, adv, mask, "gmpo", clip_low=0.4, clip_high=0.4)
    assert grad[0, 0] == 0 and (grad[0, 1:] != 0).all()  # A > 0: only the token above 0.4
    assert (grad[1] != 0).all()  # A < 0 and l > 0.4: the lower clip only, so not clipped
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6) and metrics["clip_frac_low"] == 0
    # GSPO with the same range in ratio space drops the whole first sequence (mean l > 0.4).
    _, gspo_grad, _ = _loss_and_grad(
        log_r, old, adv, mask, "gspo", clip_low=1 - math.exp(-0.4), clip_high=math.exp(0.4) - 1
    )
    assert (gspo_grad[0] == 0).all()


# --- SAPO (spec section 3) -------------------------------------------------------------------


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 3.0)])
def test_sapo_on_policy_gradient_is_grpos_and_value_is_two_over_tau(
    taus: tuple[float, float],
) -> None:
    lp, _, adv, mask = random_batch(5, 5, 7, per_token_adv=True)
    old = lp.detach()  # r = 1: f'(1) = 1 whatever tau
    options = LossOptions(*taus)
    loss, grad, m = _loss_and_grad(
        lp, old, adv, mask, "sapo", clip_low=0.2, clip_high=0.2, options=options
    )
    _, grpo_grad, _ = _loss_and_grad(lp, old, adv, mask, "grpo", clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(grad, grpo_grad)
    # f(1) = 2/tau: the loss is not zero on-policy
    tau = torch.where(adv > 0, torch.full_like(adv, taus[0]), torch.full_like(adv, taus[1]))
    per_seq = ((-2 / tau * adv) * mask).sum(1) / mask.sum(1)
    assert loss.item() == pytest.approx(per_seq.mean().item(), rel=1e-12)
    assert m["clip_frac"] == m["clip_frac_low"] == m["clip_frac_high"] == 0  # no hard clip


def _sapo_coefficient(r: float, adv: float = 1.0) -> float:
    """w * r: |d loss / d log pi| of a lone token of ratio r (tau 1 for A > 0)."""
    lp = torch.tensor([[math.log(r)]], dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.float64)
    _, grad, _ = _loss_and_grad(
        lp, 0 * one, adv * one, one, "sapo", clip_low=0.2, clip_high=0.2, options=LossOptions()
    )
    return abs(float(grad.item()))


def test_sapo_gate_vanishes_far_off_policy_and_decays_monotonically() -> None:
    assert _sapo_coefficient(10.0) < 0.01
    for side in ([1.0, 1.2, 1.5, 2.0, 3.0, 5.0], [1.0, 0.8, 0.5, 0.2, 0.05]):
        w = [_sapo_coefficient(r) / r for r in side]
        assert all(a > b for a, b in itertools.pairwise(w)), w


# --- CISPO (spec section 4) ------------------------------------------------------------------


def test_cispo_on_policy_gradient_equals_dapos() -> None:
    lp, _, adv, mask = random_batch(6, 5, 8, per_token_adv=True)
    kw = {"loss_agg": "token_mean", "clip_high": 0.28}
    _, cispo, _ = _loss_and_grad(lp, lp.detach(), adv, mask, "cispo", clip_low=1.0, **kw)
    _, dapo, _ = _loss_and_grad(lp, lp.detach(), adv, mask, "grpo", clip_low=0.2, **kw)
    torch.testing.assert_close(cispo, dapo)


def test_cispo_keeps_the_gradient_dapo_clips() -> None:
    a, n = 0.7, 4  # one token at r = 1.5 with A > 0 among 4 tokens
    old = torch.zeros(1, n, dtype=torch.float64)
    lp = old.clone()
    lp[0, 1] = math.log(1.5)
    mask, adv = torch.ones(1, n, dtype=torch.float64), torch.full((1, n), a, dtype=torch.float64)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "loss_agg": "token_mean"}
    _, dapo, _ = _loss_and_grad(lp, old, adv, mask, "grpo", **kw)
    _, cispo, m = _loss_and_grad(lp, old, adv, mask, "cispo", **kw)
    assert dapo[0, 1] == 0
    assert cispo[0, 1].item() == pytest.approx(-1.28 * a / n, rel=1e-12)  # loss = -J
    assert m["clip_frac_high"] == pytest.approx(1 / n)


def test_cispo_default_has_no_lower_bound_and_token_mean_aggregation() -> None:
    low, high = LOSS_SPECS.get("cispo").paper_clip
    lp, _, adv, mask = random_batch(8, 4, 6, per_token_adv=True, scale=2.0)
    old = lp.detach() + 3.0  # every ratio e^-3 ~ 0.05, far below any lower clip
    none, grad, m = _loss_and_grad(lp, old, adv, mask, "cispo", clip_low=low, clip_high=high)
    tokens, _, _ = _loss_and_grad(
        lp, old, adv, mask, "cispo", clip_low=low, clip_high=high, loss_agg="token_mean"
    )
    assert none == tokens  # loss_agg None: the paper's token_mean
    expected = -math.exp(-3.0) * adv * mask / mask.sum()  # weight r itself, not clipped up
    torch.testing.assert_close(grad, expected)
    assert m["clip_frac"] == 0


# --- LUSPO (spec section 5) ------------------------------------------------------------------


def test_luspo_is_length_times_gspo_per_sequence_with_gspos_clip_masks() -> None:
    lp, old, adv, mask = random_batch(9, 8, 10, per_token_adv=False, scale=0.05)
    kw = {"clip_low": 2e-3, "clip_high": 2.5e-3}
    for i in range(8):  # one response per batch: its per-sequence loss
        row = slice(i, i + 1)
        luspo, _, _ = _loss_and_grad(lp[row], old[row], adv[row], mask[row], "luspo", **kw)
        gspo, _, _ = _loss_and_grad(lp[row], old[row], adv[row], mask[row], "gspo", **kw)
        torch.testing.assert_close(luspo, mask[i].sum() * gspo)
    _, luspo_grad, luspo_m = _loss_and_grad(lp, old, adv, mask, "luspo", **kw)
    _, gspo_grad, gspo_m = _loss_and_grad(lp, old, adv, mask, "gspo", **kw)
    zero_rows = (gspo_grad == 0).all(dim=1)
    assert zero_rows[1:].any() and not zero_rows.all()  # some responses clipped, not all
    assert torch.equal((luspo_grad == 0).all(dim=1), zero_rows)
    for key in ("clip_frac", "clip_frac_low", "clip_frac_high"):
        assert luspo_m[key] == gspo_m[key]


def test_luspo_on_policy_gradient_has_no_one_over_length() -> None:
    lp, _, adv, mask = random_batch(10, 5, 9, per_token_adv=False)
    _, grad, _ = _loss_and_grad(
        lp, lp.detach(), adv, mask, "luspo", clip_low=2e-3, clip_high=2.5e-3
    )
    torch.testing.assert_close(grad, -adv * mask / 5)  # (1/G) sum_i A_i sum_t grad log pi


# --- recipe and CLI ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,clip,agg",
    [
        ("luspo", (2e-3, 2.5e-3), "seq_mean_token_mean"),
        ("sapo", (0.2, 0.2), "seq_mean_token_mean"),
        ("gmpo", (0.4, 0.4), "seq_mean_token_mean"),
        ("cispo", (1.0, 0.2), "token_mean"),
        ("gspo", (3e-4, 4e-4), "seq_mean_token_mean"),
    ],
)
def test_recipe_takes_each_papers_defaults(
    name: str, clip: tuple[float, float], agg: str, tmp_path: Path
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(f"algorithm: {{name: {name}}}\n")
    algo = load_recipe(path).algorithm
    assert (algo.clip_low, algo.clip_high, algo.loss_agg) == (*clip, agg)
    path.write_text(f"algorithm: {{name: {name}, loss_agg: seq_mean_token_mean}}\n")
    assert load_recipe(path).algorithm.loss_agg == "seq_mean_token_mean"  # set: kept


@pytest.mark.parametrize(
    "text,problem",
    [
        ("algorithm: {name: sapo, sapo_tau_neg: 0}", "algorithm.sapo_tau_neg: Input should be"),
        ("algorithm: {name: gspo, sapo_tau_pos: 2}", "sapo_tau_pos has no effect with name gspo"),
        ("algorithm: {name: sapo, vespo_k_neg: 2}", "vespo_k_neg has no effect with name sapo"),
    ],
)
def test_sapo_temperatures_are_checked(text: str, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text + "\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert any(problem in p for p in info.value.problems), info.value.problems
    path.write_text("algorithm: {name: sapo, sapo_tau_pos: 0.5, sapo_tau_neg: 2}\n")
    algo = load_recipe(path).algorithm
    assert (algo.sapo_tau_pos, algo.sapo_tau_neg) == (0.5, 2.0)


def test_unknown_algorithm_is_one_line_at_validate_time(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("algorithm: {name: gpmo}\n")
    result = invoke_cli("validate", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "algorithm.name: unknown algorithm 'gpmo'" in lines[0]
    assert all(name in lines[0] for name in SUCCESSORS)


def test_every_successor_is_registered_with_paper_clip() -> None:
    # the papers' ranges (docs/options/successor-losses.md); every spec's: test_loss_specs.py
    papers = {"luspo": (2e-3, 2.5e-3), "sapo": (0.2, 0.2), "gmpo": (0.4, 0.4), "cispo": (1.0, 0.2)}
    assert set(SUCCESSORS) <= set(LOSS_SPECS.names())
    assert {name: LOSS_SPECS.get(name).paper_clip for name in SUCCESSORS} == papers


@pytest.mark.parametrize(
    "name,expected", [("luspo", "auto"), ("sapo", False), ("gmpo", False), ("cispo", False)]
)
def test_only_luspo_may_take_pi_old_from_the_engine(name: str, expected: bool | str) -> None:
    from gspo_cli.train.step.old_policy import resolve_engine_logprobs

    exact = {"top_p": 1.0, "top_k": 0, "rollout_correction": "off", "routing_replay": "off"}
    assert resolve_engine_logprobs("auto", algorithm=name, **exact) == expected  # type: ignore[arg-type]


def test_validate_shows_sapos_gate_not_a_clip() -> None:
    result = invoke_cli("validate", str(REPO / "recipes" / "quickstart-sapo.yaml"))
    assert result.returncode == 0, result.stderr
    summary = " ".join(result.stdout.split())
    assert "sapo (gate tau 1/1.05," in summary and "clip" not in summary, summary
