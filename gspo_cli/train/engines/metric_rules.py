"""How one metric's values combine, across micro-batches of a step and across ranks.

The one place these rules live: the RL step folds micro-batches with them and `DistContext`
folds ranks with them, so a figure does not depend on how the work was split.
"""

from __future__ import annotations

# Counts add up.
# FLOPs and peaks too: MFU over ranks is their FLOPs over the slowest time x the peaks' sum.
SUMMED = frozenset(
    {
        "completion_tokens",
        "zero_adv_groups",
        "response_tokens",
        "flops_rollout",
        "flops_train",
        "peak_flops",
        "tool_calls",
        "tool_errors",
        "tool_refused",
        "tool_time_s",
        "tool_outputs_cut",
        "tool_session_restarts",
        "judge/parse_failures",
        "judge/errors",
        "judge/calls",
        "judge/cache_hits",
        "judge/scored",
    }
)
# Per-token averages weigh each part by its response tokens.
TOKEN_WEIGHTED = frozenset(
    {
        "clip_frac",
        "clip_frac_low",
        "clip_frac_high",
        "token_ratio_mean",
        "entropy",
        "entropy_before",
        "entropy_bonus",
        "kl",
        "mismatch_token_abs_mean",
        "correction_masked_token_frac",
        "correction_weight_mean",
    }
)


# Shares of ALL of a rank's response tokens, skipped rows included (the RL step rescales them),
# so ranks weigh them by their completion tokens rather than by the tokens they trained.
ALL_TOKEN_SHARES = frozenset({"clip_frac", "clip_frac_low", "clip_frac_high"})


def rank_weight_key(key: str) -> str:
    """The per-rank count that weighs metric `key` when ranks are combined."""
    return "completion_tokens" if key in ALL_TOKEN_SHARES else "response_tokens"


def combine(key: str, values: list[float], token_weights: list[float]) -> float:
    """`values` of metric `key` from several parts (each holding `token_weights[i]` tokens).

    min of mins, max of maxes, the slowest part's time, sums of counts, token-weighted means of
    per-token metrics, and the plain mean otherwise (right for per-sequence metrics because
    every part holds as many sequences).
    """
    if key.endswith("_min"):
        return min(values)
    if key.endswith("_max") or key.startswith("time_"):
        return max(values)
    if key in SUMMED:
        return sum(values)
    if key in TOKEN_WEIGHTED and sum(token_weights) > 0:  # (0: every row was skipped)
        weighted = sum(v * w for v, w in zip(values, token_weights, strict=True))
        return weighted / sum(token_weights)
    return sum(values) / len(values)


def mfu_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """`mfu_rollout` and `mfu_train`: a phase's FLOPs over its seconds times the peak, for each
    phase `metrics` holds FLOPs, a positive time and a peak for. Ranks combined, that is their
    FLOPs summed over the slowest rank's time times the peaks summed (`combine`'s rules)."""
    out: dict[str, float] = {}
    peak = metrics.get("peak_flops", 0.0)
    for phase in ("rollout", "train"):
        flops, seconds = metrics.get(f"flops_{phase}"), metrics.get(f"time_{phase}_s", 0.0)
        if flops is not None and seconds > 0 and peak > 0:
            out[f"mfu_{phase}"] = flops / (seconds * peak)
    return out


def tool_error_share(metrics: dict[str, float]) -> dict[str, float]:
    """`tool_error_frac`: the failed share of the step's tool calls, from the summed counts
    (ranks combined: not a mean of the ranks' shares); {} without tool calls logged."""
    if "tool_calls" not in metrics:
        return {}
    return {"tool_error_frac": metrics.get("tool_errors", 0.0) / max(metrics["tool_calls"], 1.0)}
