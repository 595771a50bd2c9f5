"""KL estimators (algorithms/kl.py), the KL-in-reward penalty, and the KL and entropy terms of
`compute_policy_loss` against loop references (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.algorithms import compute_policy_loss
from gspo_cli.algorithms.advantages import group_advantages
from gspo_cli.algorithms.kl import (
    KL_ESTIMATORS,
    kl_reward_advantages,
    kl_reward_penalty,
    token_kl,
)

NAMES = ["k1", "k2", "k3", "low_var_kl"]


def _k_loop(name: str, logp: float, ref: float) -> float:
    """The estimators written out from their formulas, d = log pi_ref - log pi."""
    d = ref - logp
    if name == "k1":
        return -d
    if name == "k2":
        return d * d / 2
    if name == "k3":
        return math.exp(d) - 1 - d
    d = min(max(d, -20.0), 20.0)
    return min(max(math.exp(d) - 1 - d, -10.0), 10.0)


def test_the_registry_holds_the_four_estimators() -> None:
    assert KL_ESTIMATORS.names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_estimator_is_zero_where_the_policies_agree(name: str) -> None:
    logp = torch.tensor([[-0.3, -2.0, -7.5]], dtype=torch.float64, requires_grad=True)
    kl = token_kl(logp, logp.detach().clone(), name)
    assert torch.equal(kl, torch.zeros_like(kl))
    kl.sum().backward()
    assert logp.grad is not None
    if name in ("k2", "k3", "low_var_kl"):  # minimum at d = 0: no gradient there
        assert torch.equal(logp.grad, torch.zeros_like(logp.grad))


@pytest.mark.parametrize("name", NAMES)
def test_estimators_match_their_formulas(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=gen, dtype=torch.float64) * 6
    ref = -torch.rand(4, 5, generator=gen, dtype=torch.float64) * 6
    got = token_kl(logp, ref, name)
    want = [
        [_k_loop(name, float(logp[i, j]), float(ref[i, j])) for j in range(5)] for i in range(4)
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_k3_is_nonnegative_and_close_to_k2_for_small_log_ratios() -> None:
    d = torch.linspace(-15, 15, 3001, dtype=torch.float64)
    zero = torch.zeros_like(d)
    assert bool((token_kl(zero, d, "k3") >= 0).all())
    small = torch.linspace(-1e-2, 1e-2, 201, dtype=torch.float64)
    zero = torch.zeros_like(small)
    k3, k2 = token_kl(zero, small, "k3"), token_kl(zero, small, "k2")
    # k3 - k2 = d^3 / 6 + O(d^4)
    assert float((k3 - k2).abs().max()) <= 1e-2**3 / 6 * 1.01
    assert bool(((k3 - k2).abs() <= 0.34 * small.abs() * k2 + 1e-15).all())  # gap ~ k2 |d| / 3


def test_low_var_kl_never_exceeds_ten_and_is_k3_below_its_clamp() -> None:
    d = torch.linspace(-200, 200, 4001, dtype=torch.float64)
    zero = torch.zeros_like(d)
    low = token_kl(zero, d, "low_var_kl")
    assert bool(torch.isfinite(low).all()) and float(low.max()) <= 10.0
    assert float(low.max()) == 10.0  # it does bind for large d
    inside = token_kl(zero, d, "k3") < 10
    assert torch.equal(low[inside], token_kl(zero, d, "k3")[inside])


def test_monte_carlo_means_of_k1_and_k3_match_the_exact_kl() -> None:
    p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.4, 0.1], dtype=torch.float64)
    exact = float((p * (p / q).log()).sum())  # KL(p || q)
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(p, 400_000, replacement=True, generator=gen)  # samples of pi = p
    logp, logq = p.log()[y], q.log()[y]
    for name in ("k1", "k3"):
        mean = float(token_kl(logp, logq, name).mean())
        assert mean == pytest.approx(exact, abs=4e-3), name
    # k2 is biased: its mean is visibly off on the same samples
    assert float(token_kl(logp, logq, "k2").mean()) != pytest.approx(exact, abs=4e-3)


def test_kl_reward_penalty_and_advantages_against_a_loop() -> None:
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 3
    ref = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 3
    mask = torch.ones(4, 6)
    mask[1, 3:] = 0
    mask[3, 1:] = 0
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    for name in NAMES:
        penalty = kl_reward_penalty(old, ref, mask, name, 0.05)
        want = [
            0.05
            * sum(_k_loop(name, float(old[i, t]), float(ref[i, t])) for t in range(6) if mask[i, t])
            for i in range(4)
        ]
        torch.testing.assert_close(penalty, torch.tensor(want, dtype=torch.float64))
        adv, metrics = kl_reward_advantages(
            rewards, old, ref, mask, estimator=name, coef=0.05, group_size=2, scale=True
        )
        by_hand = group_advantages(
            torch.tensor([1.0 - want[0], -want[1], 1 - want[2], 1 - want[3]]), 2
        )
        torch.testing.assert_close(adv, by_hand, rtol=1e-6, atol=1e-6)
        assert metrics["kl_reward_penalty"] == pytest.approx(sum(want) / 4)
    # the group of two equal rewards is no longer zero-advantage once the KL differs
    assert bool((adv[2:] != 0).all()) and bool((group_advantages(rewards, 2)[2:] == 0).all())


def _loop_loss(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    ref: torch.Tensor,
    ent: torch.Tensor,
    name: str,
    beta: float,
    c_h: float,
) -> torch.Tensor:
    """GRPO's clipped token loss + beta * k + (-c_H * H), seq-mean-token-mean, one scalar op at
    a time (autograd through the loops gives the reference gradient)."""
    total = torch.zeros((), dtype=torch.float64)
    rows = 0
    for i in range(logp.shape[0]):
        n_i = int(mask[i].sum())
        if n_i == 0:
            continue
        rows += 1
        row = torch.zeros((), dtype=torch.float64)
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            r = torch.exp(logp[i, t] - old[i, t])
            pg = -torch.minimum(r * adv[i], torch.clamp(r, 0.8, 1.2) * adv[i])
            d = ref[i, t] - logp[i, t]
            if name == "k1":
                k = -d
            elif name == "k2":
                k = d * d / 2
            else:
                k = torch.exp(d) - 1 - d
                if name == "low_var_kl":
                    k = torch.clamp(k, -10.0, 10.0)
            row = row + pg + beta * k - c_h * ent[i, t]
        total = total + row / n_i
    return total / rows


@pytest.mark.parametrize("name", NAMES)
def test_loss_with_each_estimator_and_the_entropy_bonus_matches_a_loop(name: str) -> None:
    gen = torch.Generator().manual_seed(2)
    b, t, v = 3, 5, 7
    logits = torch.randn(b, t, v, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (b, t), generator=gen)
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 2 - 0.5
    ref = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 2 - 0.5
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.ones(b, t, dtype=torch.float64)
    mask[1, 2:] = 0

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        log_p = torch.log_softmax(logits, dim=-1)  # [b, t, v]
        logp = log_p.gather(-1, targets[..., None])[..., 0]  # [b, t]
        return logp, -(log_p.exp() * log_p).sum(dim=-1)  # entropy [b, t]

    logp, ent = inputs()
    loss, metrics = compute_policy_loss(
        logp, old, adv, mask, algorithm="grpo", clip_low=0.2, clip_high=0.2,
        ref_logprobs=ref, kl_coef=0.3, kl_estimator=name, entropy=ent, entropy_coef=0.07,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logits)
    logp, ent = inputs()
    want = _loop_loss(logp, old, adv, mask, ref, ent, name, 0.3, 0.07)
    (want_grad,) = torch.autograd.grad(want, logits)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-6, abs=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-6, atol=1e-6)
    assert float(want_grad.abs().sum()) > 0
    masked_mean = float((ent.detach() * mask).sum() / mask.sum())
    assert metrics["entropy_bonus"] == pytest.approx(0.07 * masked_mean)
    assert "kl" in metrics


def test_the_entropy_bonus_is_off_at_zero_and_lowers_the_loss() -> None:
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(2, 4, generator=gen, dtype=torch.float64)
    ent = torch.rand(2, 4, generator=gen, dtype=torch.float64) + 0.1
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 4)
    kwargs = {"algorithm": "gspo", "clip_low": 0.2, "clip_high": 0.2}
    base, m0 = compute_policy_loss(logp, logp, adv, mask, **kwargs)  # type: ignore[arg-type]
    off, _ = compute_policy_loss(logp, logp, adv, mask, entropy=ent, entropy_coef=0.0, **kwargs)  # type: ignore[arg-type]
    on, _ = compute_policy_loss(logp, logp, adv, mask, entropy=ent, entropy_coef=0.1, **kwargs)  # type: ignore[arg-type]
    assert torch.equal(base, off) and "entropy_bonus" not in m0
    assert float(base - on) == pytest.approx(0.1 * float(ent.mean()))


def test_an_unknown_estimator_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: k1, k2, k3, low_var_kl"):
        token_kl(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
