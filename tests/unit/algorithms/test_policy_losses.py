"""The vectorised losses against slow loops written straight from the paper's equations."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest
import torch

from gspo_cli.algorithms import (
    LOG_RATIO_CLAMP,
    LOSS_AGGREGATIONS,
    LOSS_SPECS,
    compute_policy_loss,
    loss_normalizer,
)
from gspo_cli.core.registry import UnknownNameError
from tests.support.loss_reference import reference_loss

ALGOS = ["gspo", "gspo_token", "grpo"]
AGGS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"]


def random_batch(seed: int, b: int, t: int, *, per_token_adv: bool = False, scale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    lp = (old + torch.randn(b, t, generator=g) * scale).requires_grad_(True)
    mask = torch.zeros(b, t)
    for i in range(b):  # a prompt prefix, a response of random length, then padding
        start = int(torch.randint(0, t // 2, (1,), generator=g))
        length = int(torch.randint(1, t - start + 1, (1,), generator=g))
        mask[i, start : start + length] = 1
    adv = torch.randn(b, t if per_token_adv else 1, generator=g).expand(b, t).contiguous()
    return lp, old, adv, mask


@pytest.mark.parametrize("algo,agg,seed", list(itertools.product(ALGOS, AGGS, [0, 1, 2])))
def test_matches_loop_reference_in_value_and_gradient(algo: str, agg: str, seed: int) -> None:
    lo, hi = (0.2, 0.27) if algo == "grpo" else (0.03, 0.04)
    b, t = 3 + seed, 5 + 3 * seed
    lp, old, adv, mask = random_batch(seed, b, t, per_token_adv=algo != "gspo")
    loss, _ = compute_policy_loss(
        lp, old, adv, mask, algorithm=algo, clip_low=lo, clip_high=hi, loss_agg=agg
    )
    (grad,) = torch.autograd.grad(loss, lp)
    lp_ref = lp.detach().clone().requires_grad_(True)
    ref = reference_loss(lp_ref, old, adv, mask, algo, lo, hi, agg)
    (grad_ref,) = torch.autograd.grad(ref, lp_ref)
    torch.testing.assert_close(loss, ref.to(loss.dtype), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("agg", AGGS)
def test_gspo_equals_gspo_token_with_sequence_advantages(agg: str) -> None:
    lp, old, adv, mask = random_batch(7, 6, 12, scale=0.02)
    out = {}
    for algo in ("gspo", "gspo_token"):
        x = lp.detach().clone().requires_grad_(True)
        loss, metrics = compute_policy_loss(
            x, old, adv[:, 0], mask, algorithm=algo, clip_low=3e-3, clip_high=4e-3, loss_agg=agg
        )
        out[algo] = (loss, torch.autograd.grad(loss, x)[0], metrics["clip_frac"])
    torch.testing.assert_close(out["gspo"][0], out["gspo_token"][0])
    torch.testing.assert_close(out["gspo"][1], out["gspo_token"][1])
    assert out["gspo"][2] == out["gspo_token"][2] > 0  # some responses clipped, identically


def test_gspo_equals_grpo_for_length_one_responses() -> None:
    b, t = 8, 4
    lp, old, adv, _ = random_batch(3, b, t)
    mask = torch.zeros(b, t)
    mask[torch.arange(b), torch.randint(0, t, (b,))] = 1
    out = {}
    for algo in ("gspo", "grpo"):
        x = lp.detach().clone().requires_grad_(True)
        loss, _ = compute_policy_loss(
            x, old, adv, mask, algorithm=algo, clip_low=0.1, clip_high=0.1
        )
        out[algo] = (loss, torch.autograd.grad(loss, x)[0])
    torch.testing.assert_close(out["gspo"][0], out["grpo"][0])
    torch.testing.assert_close(out["gspo"][1], out["grpo"][1])


@pytest.mark.parametrize("algo,agg", list(itertools.product(ALGOS, AGGS)))
def test_padding_changes_neither_loss_nor_gradient(algo: str, agg: str) -> None:
    lp, old, adv, mask = random_batch(11, 4, 6, per_token_adv=True)
    pad = 5  # padding filled with garbage, including huge log-ratios
    lp_padded = torch.cat([lp.detach(), torch.full((4, pad), 50.0)], dim=1).requires_grad_(True)
    old_padded = torch.cat([old, torch.full((4, pad), -50.0)], dim=1)
    adv_padded = torch.cat([adv, torch.full((4, pad), 9.0)], dim=1)
    mask_padded = torch.cat([mask, torch.zeros(4, pad)], dim=1)
    kw = {"algorithm": algo, "clip_low": 0.2, "clip_high": 0.2, "loss_agg": agg}
    x = lp.detach().clone().requires_grad_(True)
    loss, m = compute_policy_loss(x, old, adv, mask, **kw)  # type: ignore[arg-type]
    loss_p, m_p = compute_policy_loss(lp_padded, old_padded, adv_padded, mask_padded, **kw)  # type: ignore[arg-type]
    torch.testing.assert_close(loss, loss_p)
    grad_p = torch.autograd.grad(loss_p, lp_padded)[0]
    torch.testing.assert_close(torch.autograd.grad(loss, x)[0], grad_p[:, :6])
    assert torch.equal(grad_p[:, 6:], torch.zeros(4, pad))
    assert m == m_p


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("gap", [1e3, -1e3, 1e6])
def test_extreme_log_ratios_give_finite_loss_and_gradients(algo: str, gap: float) -> None:
    lp, old, adv, mask = random_batch(5, 4, 8)
    x = (lp.detach() + gap).requires_grad_(True)
    loss, metrics = compute_policy_loss(
        x, old, adv, mask, algorithm=algo, clip_low=0.2, clip_high=0.2
    )
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_clip_fraction_counts_only_binding_clips_token_weighted() -> None:
    # Four GSPO responses of lengths 1, 2, 3, 4 (10 tokens) with sequence ratios chosen by hand.
    lengths = [1, 2, 3, 4]
    log_s = torch.tensor([0.5, 0.5, -0.5, -0.5])  # s = 1.65, 1.65, 0.61, 0.61
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])  # binds: high (1 token), none, low (3), none
    mask = torch.zeros(4, 4)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    old = torch.zeros(4, 4)
    lp = log_s.unsqueeze(1).expand(4, 4).clone()
    _, m = compute_policy_loss(lp, old, adv, mask, algorithm="gspo", clip_low=0.2, clip_high=0.2)
    assert m["clip_frac_high"] == pytest.approx(1 / 10)
    assert m["clip_frac_low"] == pytest.approx(3 / 10)
    assert m["clip_frac"] == pytest.approx(4 / 10)
    # GRPO decides per token: only the tokens whose own ratio leaves the range count.
    lp_tok = torch.zeros(4, 4)
    lp_tok[3, 0] = 1.0  # ratio e > 1.2 with A > 0: binds
    lp_tok[3, 1] = -1.0  # ratio 1/e < 0.8 with A > 0: does not bind
    _, m = compute_policy_loss(
        lp_tok, old, adv, mask, algorithm="grpo", clip_low=0.2, clip_high=0.2
    )
    assert m["clip_frac_high"] == pytest.approx(1 / 10) and m["clip_frac_low"] == 0


def test_ratio_metrics_and_zero_advantage_groups() -> None:
    lp = torch.tensor([[0.1, 0.3], [0.0, -0.2], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(4, 2)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])
    _, m = compute_policy_loss(
        lp, torch.zeros(4, 2), adv, mask, algorithm="gspo", clip_low=1, clip_high=1, group_size=2
    )
    assert m["token_ratio_max"] == pytest.approx(torch.tensor(0.3).exp().item())
    assert m["seq_ratio_min"] == pytest.approx(torch.tensor(-0.1).exp().item())
    assert m["zero_adv_group_frac"] == 0.5
    assert m["zero_adv_seq_frac"] == 0.5


@pytest.mark.parametrize("algo,agg", list(itertools.product(ALGOS, AGGS)))
def test_micro_batches_with_global_normalizer_equal_one_batch(algo: str, agg: str) -> None:
    lp, old, adv, mask = random_batch(21, 8, 7, per_token_adv=True)
    kw = {"algorithm": algo, "clip_low": 0.2, "clip_high": 0.2, "loss_agg": agg}
    x = lp.detach().clone().requires_grad_(True)
    full, _ = compute_policy_loss(x, old, adv, mask, **kw)  # type: ignore[arg-type]
    full.backward()
    y = lp.detach().clone().requires_grad_(True)
    norm = loss_normalizer(mask, agg)
    for chunk in torch.arange(8).split(3):
        part, _ = compute_policy_loss(
            y[chunk], old[chunk], adv[chunk], mask[chunk], normalizer=norm, **kw
        )  # type: ignore[arg-type]
        part.backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_kl_penalty_off_by_default_and_positive_when_on() -> None:
    lp, old, adv, mask = random_batch(2, 4, 6)
    ref = old + 0.5
    base, m0 = compute_policy_loss(
        lp, old, adv, mask, algorithm="gspo", clip_low=0.2, clip_high=0.2
    )
    off, _ = compute_policy_loss(
        lp, old, adv, mask, algorithm="gspo", clip_low=0.2, clip_high=0.2, ref_logprobs=ref
    )
    on, m1 = compute_policy_loss(
        lp,
        old,
        adv,
        mask,
        algorithm="gspo",
        clip_low=0.2,
        clip_high=0.2,
        ref_logprobs=ref,
        kl_coef=0.1,
    )
    assert torch.equal(base, off) and "kl" not in m0
    assert m1["kl"] > 0 and on > base


def test_unknown_names_list_the_known_ones() -> None:
    lp, old, adv, mask = random_batch(0, 2, 3)
    with pytest.raises(UnknownNameError, match="known: cispo, dppo_kl, dppo_tv, gmpo, grpo, gspo"):
        compute_policy_loss(lp, old, adv, mask, algorithm="ppo", clip_low=0.2, clip_high=0.2)
    with pytest.raises(UnknownNameError, match="seq_mean_token_mean"):
        compute_policy_loss(
            lp, old, adv, mask, algorithm="gspo", clip_low=0.2, clip_high=0.2, loss_agg="x"
        )
    # the successors (losses/luspo.py, sapo.py, gmpo.py, cispo.py) have their own loop
    # references: test_successor_losses.py; DPPO and VESPO (dppo.py, vespo.py) theirs in
    # tests/support/loss_reference.py, run on tool trajectories by test_tool_loss.py
    successors = ["luspo", "sapo", "gmpo", "cispo", "dppo_tv", "dppo_kl", "vespo"]
    assert LOSS_SPECS.names() == sorted([*ALGOS, *successors])
    assert LOSS_AGGREGATIONS.names() == sorted(AGGS)


def test_algorithms_package_imports_only_torch() -> None:
    code = (
        "import sys, gspo_cli.algorithms; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('transformers', 'yaml', 'pydantic', 'datasets') or m.startswith('gspo_cli.recipe')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gspo_token_matches_gspo_gradient_even_where_the_clamp_binds() -> None:
    lp, old, adv, mask = random_batch(9, 4, 6)
    lp = lp.detach()
    lp[0] += 100.0  # one corrupted sample, far beyond the clamp
    grads = {}
    for algo in ("gspo", "gspo_token"):
        x = lp.clone().requires_grad_(True)
        loss, _ = compute_policy_loss(
            x, old, adv[:, 0], mask, algorithm=algo, clip_low=0.2, clip_high=0.2
        )
        grads[algo] = torch.autograd.grad(loss, x)[0]
    assert torch.equal(grads["gspo"][0], torch.zeros(6))
    torch.testing.assert_close(grads["gspo"], grads["gspo_token"])


@pytest.mark.parametrize("algo", ["gspo", "grpo"])
def test_the_clamp_changes_a_negative_advantage_term_past_its_bound(algo: str) -> None:
    """What LOG_RATIO_CLAMP's comment says: with A > 0 the clip holds a huge ratio flat anyway;
    with A < 0 the min keeps the unclipped r * A, so past the clamp the term is exp(20) * A and
    its gradient is 0, not r * A with a gradient growing with r."""
    old = torch.zeros(1, 1)
    mask = torch.ones(1, 1)
    for advantage in (1.0, -1.0):
        logprobs = torch.full((1, 1), 25.0, requires_grad=True)  # log-ratio 25 > 20
        loss, _ = compute_policy_loss(
            logprobs, old, torch.tensor([advantage]), mask,
            algorithm=algo, clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_mean",
        )  # fmt: skip
        loss.backward()
        assert logprobs.grad is not None
        assert float(logprobs.grad.abs().sum()) == 0.0  # the clip's (A > 0), the clamp's (A < 0)
        if advantage < 0:  # -min(r A, clip(r) A) = -r A with r = exp(20), not exp(25)
            assert float(loss) == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-5)
