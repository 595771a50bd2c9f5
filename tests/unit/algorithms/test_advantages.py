import pytest
import torch

from gspo_cli.algorithms import ADVANTAGE_STD_EPS, group_advantages


def test_matches_eq6_per_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.2, 0.9, 0.1])
    adv = group_advantages(rewards, 4)
    for g in range(2):
        r = rewards[4 * g : 4 * g + 4]
        expected = (r - r.mean()) / (r.std(unbiased=False) + ADVANTAGE_STD_EPS)
        torch.testing.assert_close(adv[4 * g : 4 * g + 4], expected)


def test_mean_only_option_skips_std() -> None:
    rewards = torch.tensor([3.0, 1.0, 2.0, 2.0])
    torch.testing.assert_close(
        group_advantages(rewards, 2, scale=False), torch.tensor([1.0, -1.0, 0.0, 0.0])
    )


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 1 / 3])
def test_equal_reward_groups_are_exactly_zero(value: float) -> None:
    rewards = torch.tensor([value] * 7 + [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = group_advantages(rewards, 7)
    assert torch.equal(adv[:7], torch.zeros(7))
    assert (adv[7:] != 0).all()


def test_two_sample_group_gives_plus_minus_one() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0]), 2)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)


def test_rejects_ragged_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)


def test_penalty_differences_below_float32_resolution_survive() -> None:
    """A KL penalty in the reward can separate an all-correct group's rewards by ~1e-9, below
    float32's resolution next to 1: the advantages are computed in float64 (issue 35)."""
    rewards = torch.tensor([1.0, 1.0 - 1e-9, 1.0 - 3e-9, 1.0 - 2e-9], dtype=torch.float64)
    centred = rewards - rewards.mean()
    expected = centred / (rewards.std(unbiased=False) + ADVANTAGE_STD_EPS)
    got = group_advantages(rewards, 4)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, rtol=1e-6, atol=0)
    assert float(got.abs().min()) > 1e-5  # float32 first would give exactly 0
