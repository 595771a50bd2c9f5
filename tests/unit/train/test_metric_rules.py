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


def test_tool_counts_add_up_over_ranks_and_the_failed_share_comes_from_them() -> None:
    from gspo_cli.rollout.batch import RolloutBatch, ToolTrace
    from gspo_cli.train.engines.metric_rules import combine, tool_error_share
    from gspo_cli.train.step.metrics import tool_metrics

    def rank(traces: list[ToolTrace]) -> dict[str, float]:
        batch = RolloutBatch([[1]] * len(traces), [[2]] * len(traces), None, [""], [False])
        batch.tool_traces = traces
        return tool_metrics(batch)

    a = rank([ToolTrace(calls=1, errors=1, seconds=0.5), ToolTrace(calls=1)])  # 1 of 2 failed
    b = rank([ToolTrace(calls=4, seconds=1.0), ToolTrace(calls=4, refused=1)])  # 0 of 8 failed
    assert a["tool_error_frac"] == 0.5 and b["tool_error_frac"] == 0.0
    both = {key: combine(key, [a[key], b[key]], [1.0, 1.0]) for key in a}
    both.update(tool_error_share(both))
    assert both["tool_error_frac"] == 0.1  # 1 failed of 10, not the ranks' mean 0.25
    assert (both["tool_calls"], both["tool_refused"], both["tool_time_s"]) == (10.0, 1.0, 1.5)
    assert both["tool_calls_per_response"] == 2.5  # per response: a mean (equal rows per rank)
