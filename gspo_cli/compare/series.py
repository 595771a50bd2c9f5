"""Metric curves of a run: derived metrics, trailing smoothing over steps, and x-axis positions.

x axes:
- step: the RL step.
- tokens: cumulative completion_tokens.
- time: cumulative time_step_s (seconds).
When a run logs only some steps, a record stands for every step since the previous record, so
runs logged at different intervals stay aligned on the same axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gspo_cli.compare.runs import CURVE_PREFIX, HELDOUT_FORM_KEYS, Run, is_environment_key

X_LABELS = {
    "step": "RL step",
    "tokens": "completion tokens (cumulative)",
    "time": "wall time in s (cumulative time_step_s)",
}
X_SOURCES = {"tokens": "completion_tokens", "time": "time_step_s"}
HELDOUT, RATIO_SPREAD = "heldout_accuracy", "ratio_spread"
# Curves of the held-out answer forms: heldout_answered, heldout_accuracy_any_form, ...
HELDOUT_FORMS = {f"heldout_{key}": key for key in HELDOUT_FORM_KEYS}


# The judges' scores on held-out prompts (reward.heldout_judge), every N steps: the training
# judge rising while the held-out judge falls is judge hacking (docs/judges.md).
JUDGES = (("judge_train/mean", "judge_train"), ("judge_heldout/mean", "judge_heldout"))


# Held-out accuracy of one environment of a mixture: heldout_env/NAME/accuracy
HELDOUT_ENVIRONMENT = "heldout_"


def _sparse_form(key: str) -> bool:
    """An environment's held-out accuracy (env/NAME/accuracy) or a benchmark curve of the
    run's checkpoints (curve/BENCHMARK/avg@k), with or without the heldout_ prefix."""
    stripped = key.removeprefix(HELDOUT_ENVIRONMENT)
    return is_environment_key(stripped) or stripped.startswith(CURVE_PREFIX)


def environment_heldout_keys(runs: list[Run]) -> list[str]:
    """heldout_env/NAME/accuracy for each environment any of `runs` evaluated, and
    heldout_curve/BENCHMARK/avg@k for each benchmark curve (`gspo eval RUN --steps`), sorted."""
    found = {key for run in runs for key in run.heldout_forms if _sparse_form(key)}
    return sorted(HELDOUT_ENVIRONMENT + key for key in found)


def is_heldout(key: str) -> bool:
    """A curve of the sparse held-out evaluations: never smoothed."""
    return key == HELDOUT or key in HELDOUT_FORMS or key in dict(JUDGES) or _sparse_form(key)


@dataclass(frozen=True)
class Series:
    """A metric by step; values may be NaN or inf."""

    steps: np.ndarray
    values: np.ndarray

    def finite(self) -> Series:
        keep = np.isfinite(self.values)
        return Series(self.steps[keep], self.values[keep])


def metric_series(run: Run, key: str) -> Series | None:
    """The curve of `key`, including derived ones; None when the run does not have it.

    heldout_accuracy: eval.jsonl / metrics / summary.json (step 0 = before RL).
    heldout_answered, heldout_accuracy_any_form, heldout_ran_clean: eval.jsonl's answer forms.
    heldout_env/NAME/accuracy: one environment's held-out accuracy (a mixture).
    ratio_spread: seq_ratio_max - seq_ratio_min per step.
    """
    if key in HELDOUT_FORMS or _sparse_form(key):
        points = run.heldout_forms.get(HELDOUT_FORMS.get(key, key.removeprefix("heldout_")))
        if not points:
            return None
        steps = np.array([s for s, _ in points], dtype=np.int64)
        return Series(steps, np.array([v for _, v in points], dtype=np.float64))
    if key == HELDOUT:
        if not run.heldout:
            return None
        steps = np.array([s for s, _ in run.heldout], dtype=np.int64)
        return Series(steps, np.array([v for _, v in run.heldout], dtype=np.float64))
    if key == RATIO_SPREAD:
        rows = [r for r in run.records if "seq_ratio_max" in r and "seq_ratio_min" in r]
        if not rows:
            return None
        steps = np.array([int(r["step"]) for r in rows], dtype=np.int64)
        spread = [r["seq_ratio_max"] - r["seq_ratio_min"] for r in rows]
        return Series(steps, np.array(spread, dtype=np.float64))
    if not run.has(key):
        return None
    return Series(*run.column(key))


def smooth(series: Series, window: int) -> Series:
    """Trailing moving average over the steps (s - window, s], ignoring NaN and inf.

    The window counts steps, not records, so sparse logging is not over-smoothed. A window
    without any finite value gives NaN; window 1 returns the series unchanged.
    """
    if window <= 1 or len(series.steps) == 0:
        return series
    finite = np.isfinite(series.values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, series.values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    starts = np.searchsorted(series.steps, series.steps - window, side="right")
    ends = np.arange(1, len(series.steps) + 1)
    count = counts[ends] - counts[starts]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (sums[ends] - sums[starts]) / count
    return Series(series.steps, np.where(count > 0, mean, np.nan))


def x_positions(run: Run, x: str, steps: np.ndarray) -> np.ndarray | None:
    """Where `steps` of `run` lie on the x axis; None when the run lacks that axis' metric."""
    if x == "step":
        return steps.astype(np.float64)
    source = metric_series(run, X_SOURCES[x])
    if source is None or not np.isfinite(source.values).any():
        return None
    gaps = np.diff(np.concatenate([[0], source.steps]))
    # A missing value adds nothing rather than poisoning every later position.
    increments = np.where(np.isfinite(source.values), source.values, 0.0) * gaps
    cumulative = np.concatenate([[0.0], np.cumsum(increments)])
    known = np.concatenate([[0], source.steps]).astype(np.float64)
    positions: np.ndarray = np.interp(steps.astype(np.float64), known, cumulative)
    return positions
