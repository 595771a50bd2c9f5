"""Stability verdicts: the first step where a run went wrong, or "stable".

Checks (thresholds are module constants, independent of --smooth so verdicts do not change with
the display):
- non-finite: the first step whose loss, reward_mean or grad_norm is NaN or inf.
- reward collapse: reward_mean smoothed over VERDICT_WINDOW steps ends more than
  REWARD_DROP_FRACTION of the reward range below its running best and never climbs back within
  that margin by the end of the run. The reward range is the sum of |weight| of the recipe's
  reward functions (1.0 by default: verifier rewards lie in [0, 1]). The step reported is the
  first of the uninterrupted raw rewards below the margin that lead into the collapse (the
  smoothed curve lags a sudden drop), else the step the smoothed curve crossed it.
- entropy collapse: the first step whose entropy is below ENTROPY_FLOOR_FRACTION of the initial
  entropy (the mean of the first ENTROPY_BASELINE_POINTS finite values).
- the trainer's own collapse detector (`gspo_cli.runs.collapse`), replayed over the records: entropy
  explosion or collapse, reward crash, ratio blow-up, held-out drop; and every event the
  trainer's guards recorded in events.jsonl (skipped non-finite updates, rollbacks, stops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gspo_cli.compare.runs import Run
from gspo_cli.compare.series import metric_series, smooth
from gspo_cli.runs.collapse import replay

VERDICT_WINDOW = 5
REWARD_DROP_FRACTION = 0.2
ENTROPY_FLOOR_FRACTION = 0.1
ENTROPY_BASELINE_POINTS = 3
NON_FINITE_KEYS = ("loss", "reward_mean", "grad_norm")
STABLE = "stable"


@dataclass(frozen=True)
class Issue:
    """One instability: its kind (non_finite, reward_collapse, entropy_collapse) and step."""

    kind: str
    step: int
    detail: str


def first_non_finite(run: Run) -> Issue | None:
    """The first step with NaN/inf in loss, reward_mean or grad_norm."""
    for record in run.records:
        bad = [
            f"{k}={record[k]}"
            for k in NON_FINITE_KEYS
            if k in record and not math.isfinite(record[k])
        ]
        if bad:
            step = int(record["step"])
            return Issue("non_finite", step, f"NaN/inf at step {step} ({', '.join(bad)})")
    return None


def reward_range(run: Run) -> float:
    """Sum of |weight| of the recipe's reward functions; 1.0 when unknown."""
    functions = run.setting("reward.functions")
    if not isinstance(functions, list):
        return 1.0
    weights = [f.get("weight", 1.0) for f in functions if isinstance(f, dict)]
    total = sum(abs(float(w)) for w in weights if isinstance(w, int | float))
    return total if total > 0 else 1.0


def reward_collapse(run: Run) -> Issue | None:
    """A smoothed-reward drop below the running best by more than the margin, unrecovered."""
    raw = metric_series(run, "reward_mean")
    if raw is None:
        return None
    smoothed = smooth(raw, VERDICT_WINDOW)
    keep = np.isfinite(smoothed.values)
    steps, values, raw_values = smoothed.steps[keep], smoothed.values[keep], raw.values[keep]
    if len(values) < 2:
        return None
    best = np.maximum.accumulate(values)
    margin = REWARD_DROP_FRACTION * reward_range(run)
    low = values < best - margin
    if not low[-1]:
        return None
    # values[0] is its own running best, so some point is not low.
    detect = int(np.flatnonzero(~low)[-1]) + 1
    peak = float(best[detect])
    peak_index = int(np.argmax(values[: detect + 1]))
    onset = detect
    while onset - 1 > peak_index and raw_values[onset - 1] < peak - margin:
        onset -= 1
    if raw_values[detect] >= peak - margin:
        onset = detect
    step = int(steps[onset])
    detail = (
        f"reward collapse at step {step} ({VERDICT_WINDOW}-step mean: best {peak:.3f} at step "
        f"{int(steps[peak_index])}, {float(values[-1]):.3f} at step {int(steps[-1])}, "
        f"no recovery)"
    )
    return Issue("reward_collapse", step, detail)


def entropy_collapse(run: Run) -> Issue | None:
    """The first step whose entropy falls below a small fraction of the initial entropy."""
    series = metric_series(run, "entropy")
    if series is None:
        return None
    finite = series.finite()
    if len(finite.values) <= ENTROPY_BASELINE_POINTS:
        return None
    initial = float(np.mean(finite.values[:ENTROPY_BASELINE_POINTS]))
    if initial <= 0:
        return None
    below = np.flatnonzero(finite.values < ENTROPY_FLOOR_FRACTION * initial)
    if len(below) == 0:
        return None
    index = int(below[0])
    step = int(finite.steps[index])
    detail = (
        f"entropy collapse at step {step} ({float(finite.values[index]):.3g} < "
        f"{ENTROPY_FLOOR_FRACTION:.0%} of initial {initial:.3g})"
    )
    return Issue("entropy_collapse", step, detail)


def detector_issues(run: Run) -> list[Issue]:
    """The trainer's collapse detector replayed, plus the events the trainer recorded."""
    found = [Issue(e.signal, e.step, f"{e.signal.replace('_', ' ')} at step {e.step} ({e.detail})")
             for e in replay(run.records, dict(run.heldout), run.heldout_size)]  # fmt: skip
    for event in run.events:
        step = int(event.get("step", 0))
        action = str(event.get("action", "event"))
        found.append(Issue(action, step, f"{action} at step {step} ({event.get('detail', '')})"))
    return found


def assess(run: Run) -> list[Issue]:
    """Every instability found in the run, by step (one issue per kind: its first step)."""
    found = [check(run) for check in (first_non_finite, reward_collapse, entropy_collapse)]
    issues = [i for i in found if i is not None] + detector_issues(run)
    first: dict[str, Issue] = {}
    for issue in sorted(issues, key=lambda i: i.step):
        first.setdefault(issue.kind, issue)
    return sorted(first.values(), key=lambda i: i.step)


def verdict_text(issues: list[Issue]) -> str:
    return "; ".join(i.detail for i in issues) if issues else STABLE
