"""The numbers compared per run, and their differences against the baseline run.

Final and best reward are read from the reward curve smoothed with --smooth (the final value is
the last finite smoothed value, i.e. the trailing mean of the last W steps). Means (clip fraction,
ratio spread, entropy, throughput, ...) are over the raw finite values of every logged step.
"reward_at_common_x" is the smoothed reward at the furthest x every run reached, so runs of
different lengths are compared at the same point. Each reward function's own curve
(`reward/<name>/mean`, logged by the trainer) gets its final smoothed value too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gspo_cli.compare.runs import Run
from gspo_cli.compare.series import (
    HELDOUT,
    HELDOUT_FORMS,
    JUDGES,
    RATIO_SPREAD,
    environment_heldout_keys,
    metric_series,
    smooth,
    x_positions,
)
from gspo_cli.compare.verdicts import Issue, assess

MEANS = (
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    RATIO_SPREAD,
    "entropy",
    "tokens_per_s",
    "mfu_rollout",
    "mfu_train",
    "expert_volatility",
    "mismatch_token_abs_mean",
    "mismatch_outside_clip_frac",
    "correction_masked_token_frac",
    "tool_calls_per_response",
    "tool_error_frac",
)
REWARD_FUNCTION = re.compile(r"reward/.+/mean")  # one reward function's mean per step
ENV_REWARD = re.compile(r"env/[^/]+/reward_mean")  # one environment's mean reward per step
HEADLINE = (
    "final_reward",
    "best_reward",
    "reward_at_common_x",
    "heldout_last",
    "heldout_best",
    *(f"{key}_last" for key in HELDOUT_FORMS),
    "clip_frac_mean",
    "tokens_per_s_mean",
)


@dataclass
class RunReport:
    """A run with its numbers, instabilities and differences against the baseline."""

    run: Run
    stats: dict[str, Any]
    issues: list[Issue]
    deltas: dict[str, float] = field(default_factory=dict)


@dataclass
class SeedGroup:
    """Runs of one recipe, ordered by seed (--group-seeds; seeds.py groups them). `view` holds
    the group's numbers as a RunReport whose stats are Estimates/Spreads, so the table's cell
    functions format it as they are."""

    label: str
    name: str
    reports: list[RunReport]
    view: RunReport

    @property
    def seeds(self) -> list[Any]:
        return [r.run.setting("trainer.seed") for r in self.reports]


@dataclass
class Comparison:
    reports: list[RunReport]
    baseline: RunReport
    x: str
    smooth: int
    metrics: list[str] | None
    common_x: float | None
    groups: list[SeedGroup] | None = None  # --group-seeds: the table's and plots' columns
    reward_keys: list[str] = field(default_factory=list)  # reward/<name>/mean some run has
    # heldout_env/NAME/accuracy some run has (a mixture of environments)
    environment_keys: list[str] = field(default_factory=list)


def reward_function_keys(runs: list[Run]) -> list[str]:
    """The per-function reward curves (`reward/<name>/mean`) and a mixture's per-environment
    reward (`env/NAME/reward_mean`) any of `runs` logged, sorted."""
    keys = {k for run in runs for record in run.records for k in record}
    return sorted(k for k in keys if REWARD_FUNCTION.fullmatch(k) or ENV_REWARD.fullmatch(k))


def final_value(run: Run, key: str, window: int) -> float | None:
    """The last finite value of `key`'s curve smoothed over `window` steps."""
    series = metric_series(run, key)
    finite = smooth(series, window).finite() if series is not None else None
    return float(finite.values[-1]) if finite is not None and len(finite.values) else None


def mean_of(run: Run, key: str) -> float | None:
    series = metric_series(run, key)
    if series is None or not np.isfinite(series.values).any():
        return None
    return float(np.mean(series.finite().values))


def _reward_stats(run: Run, window: int) -> dict[str, Any]:
    series = metric_series(run, "reward_mean")
    finite = smooth(series, window).finite() if series is not None else None
    if finite is None or len(finite.values) == 0:
        return {}
    best = int(np.argmax(finite.values))
    return {
        "final_reward": float(finite.values[-1]),
        "final_reward_step": int(finite.steps[-1]),
        "best_reward": float(finite.values[best]),
        "best_reward_step": int(finite.steps[best]),
    }


def _curve_ends(run: Run, key: str, prefix: str, window: int) -> dict[str, Any]:
    """First, last and best finite values of a (smoothed) curve, with their steps."""
    series = metric_series(run, key)
    finite = smooth(series, window).finite() if series is not None else None
    if finite is None or len(finite.values) == 0:
        return {}
    best = int(np.argmax(finite.values))
    return {
        f"{prefix}_first": float(finite.values[0]),
        f"{prefix}_first_step": int(finite.steps[0]),
        f"{prefix}_last": float(finite.values[-1]),
        f"{prefix}_last_step": int(finite.steps[-1]),
        f"{prefix}_best": float(finite.values[best]),
        f"{prefix}_best_step": int(finite.steps[best]),
    }


def run_stats(run: Run, window: int, extra: list[str]) -> dict[str, Any]:
    """Every headline number of one run (None/absent where the run lacks the metric)."""
    stats: dict[str, Any] = {
        "algorithm": run.algorithm,
        "model": run.model,
        "clip_low": run.setting("algorithm.clip_low"),
        "clip_high": run.setting("algorithm.clip_high"),
        "routing_replay": run.setting("algorithm.routing_replay") or "off",
        "steps_done": run.steps_done,
        "steps_planned": run.steps_planned,
    }
    stats.update(_reward_stats(run, window))
    stats.update(_curve_ends(run, HELDOUT, "heldout", 1))  # sparse evals: never smoothed
    for key in HELDOUT_FORMS:  # answered and accuracy in any form beside it
        stats.update(_curve_ends(run, key, key, 1))
    for key, prefix in JUDGES:  # the training judge beside a held-out one (docs/judges.md)
        stats.update(_curve_ends(run, key, prefix, 1))
    for key in environment_heldout_keys([run]):  # each environment of a mixture
        stats.update(_curve_ends(run, key, key, 1))
    entropy = _curve_ends(run, "entropy", "entropy", window)
    stats.update({k: v for k, v in entropy.items() if k.endswith(("_first", "_last"))})
    for key in (*MEANS, *extra):
        stats[f"{key}_mean"] = mean_of(run, key)
    stats["eval"] = {
        r.label: {"value": r.value, "ci_low": r.ci_low, "ci_high": r.ci_high, "file": str(r.source)}
        for r in run.results
    }
    return stats


def reward_at(run: Run, x: str, window: int, at: float) -> float | None:
    """The smoothed reward at position `at` of the x axis (linear between records)."""
    series = metric_series(run, "reward_mean")
    if series is None:
        return None
    finite = smooth(series, window).finite()
    xs = x_positions(run, x, finite.steps)
    if xs is None or len(xs) == 0 or not xs[0] <= at <= xs[-1]:
        return None
    return float(np.interp(at, xs, finite.values))


def common_x(runs: list[Run], x: str) -> float | None:
    """The furthest x every run with a reward reached; None for a single run."""
    ends = []
    for run in runs:
        series = metric_series(run, "reward_mean")
        xs = x_positions(run, x, series.finite().steps) if series is not None else None
        if xs is not None and len(xs):
            ends.append(float(xs[-1]))
    return min(ends) if len(ends) > 1 else None


def _deltas(stats: dict[str, Any], base: dict[str, Any], extra: list[str]) -> dict[str, float]:
    deltas = {
        key: float(stats[key] - base[key])
        for key in (*HEADLINE, *extra)
        if stats.get(key) is not None and base.get(key) is not None
    }
    for label, entry in stats["eval"].items():
        if label in base["eval"]:
            deltas[f"eval:{label}"] = entry["value"] - base["eval"][label]["value"]
    return deltas


def compare(
    runs: list[Run], baseline: Run, x: str, window: int, metrics: list[str] | None
) -> Comparison:
    """Numbers, verdicts and differences against `baseline` for every run."""
    known = {*MEANS, "reward_mean", HELDOUT, *HELDOUT_FORMS, "eval"}
    extra = [m for m in metrics or [] if m not in known]
    reports = [RunReport(run, run_stats(run, window, extra), assess(run)) for run in runs]
    shared = common_x(runs, x)
    for report in reports:
        report.stats["reward_at_common_x"] = (
            reward_at(report.run, x, window, shared) if shared is not None else None
        )
    reward_keys = reward_function_keys(runs)
    for report in reports:
        for key in reward_keys:
            report.stats[f"{key}_final"] = final_value(report.run, key, window)
    base = next(r for r in reports if r.run is baseline)
    finals = [f"{key}_final" for key in reward_keys]
    for report in reports:
        if report is not base:
            report.deltas = _deltas(report.stats, base.stats, finals)
    return Comparison(
        reports, base, x, window, metrics, shared, reward_keys=reward_keys,
        environment_keys=environment_heldout_keys(runs),
    )  # fmt: skip
