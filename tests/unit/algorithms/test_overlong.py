"""DAPO's soft overlong punishment (Eq. 13) as a pure function of response lengths."""

from __future__ import annotations

import pytest
import torch

from gspo_cli.algorithms.overlong import overlong_penalty


def test_the_papers_settings_give_the_papers_values() -> None:
    # expected length 16,384, L_cache 4,096, L_max 20,480 (paper, Sec. 3.4 / Eq. 13)
    lengths = torch.tensor([100, 16384, 18432, 20480])
    got = overlong_penalty(lengths, max_len=20480, buffer=4096)
    assert got.tolist() == [0.0, 0.0, -0.5, -1.0]


def test_linear_inside_the_buffer_and_scaled_by_the_penalty() -> None:
    lengths = torch.arange(0, 13)  # [13]
    got = overlong_penalty(lengths, max_len=12, buffer=4, penalty=0.5)
    expected = [0.0] * 9 + [-0.125, -0.25, -0.375, -0.5]  # from |y| = 9 to L_max = 12
    assert got.tolist() == pytest.approx(expected)
    assert overlong_penalty(torch.tensor([30]), max_len=12, buffer=4).item() == -1.0  # |y| > L_max


def test_a_buffer_of_zero_is_off() -> None:
    assert overlong_penalty(torch.tensor([1, 64]), max_len=64, buffer=0).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("buffer,penalty", [(-1, 1.0), (64, 1.0), (65, 1.0), (8, -1.0)])
def test_bad_settings_raise(buffer: int, penalty: float) -> None:
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_len=64, buffer=buffer, penalty=penalty)
