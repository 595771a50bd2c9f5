from __future__ import annotations

import pytest

from gspo_cli.train.engines.metric_rules import combine


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


def test_clip_fractions_combine_over_ranks_by_all_their_tokens() -> None:
    # After zero-advantage skipping a clip fraction is a share of ALL of a rank's response
    # tokens; a rank that trained no row must still count its tokens in the denominator.
    from gspo_cli.train.engines.metric_rules import rank_weight_key

    ranks = [
        {"clip_frac": 0.0, "response_tokens": 0.0, "completion_tokens": 100.0},  # all skipped
        {"clip_frac": 0.2, "response_tokens": 30.0, "completion_tokens": 100.0},
    ]
    weights = [r[rank_weight_key("clip_frac")] for r in ranks]
    assert combine("clip_frac", [r["clip_frac"] for r in ranks], weights) == pytest.approx(0.1)
    assert rank_weight_key("entropy") == "response_tokens"  # over the trained tokens
