from __future__ import annotations

import pytest

from gspo_cli.train.metric_rules import combine


@pytest.mark.parametrize(
    "key,expected",
    [
        ("ratio_min", 1.0),
        ("ratio_max", 4.0),
        ("time_step_s", 4.0),  # the slowest part sets the step time
        ("completion_tokens", 7.0),
        ("clip_frac", (1 * 1 + 2 * 1 + 4 * 2) / 4),  # weighted by each part's tokens
        ("reward_mean", 7 / 3),
    ],
)
def test_each_kind_of_metric_combines_by_its_rule(key: str, expected: float) -> None:
    assert combine(key, [1.0, 2.0, 4.0], [1.0, 1.0, 2.0]) == pytest.approx(expected)
