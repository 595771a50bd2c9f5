"""--group-seeds: runs of one recipe that differ only in their seed, compared as one column.

Grouping rule: two runs belong together when their saved recipe.yaml files are equal once these
keys are left out:
- trainer.seed (what varies) and trainer.out_dir (where the run folder went);
- the logging section (progress display and wandb: they do not change training);
- a seed suffix of `name` that repeats the run's own trainer.seed ("-s2", "_seed2", "-seed-2",
  ".s2"), so runs started with `--set name=x-s2 --set trainer.seed=2` join group "x".
Any other difference (a clip range, trainer.steps, ...) keeps runs apart; when two groups share
a name a warning names the keys they differ in. A group is labelled `<name> (<n> seeds)`.

Per group: every number run_stats gives per run, as the mean over seeds with a 95% t interval
(intervals.Estimate); steps (of the best reward, steps done) as their range over seeds; settings
(algorithm, model, routing replay) are shared by construction. Same-named groups get "#2"...
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gspo_cli.compare.intervals import Estimate, Spread, t975
from gspo_cli.compare.runs import Problems, Run
from gspo_cli.compare.series import is_heldout, metric_series, smooth, x_positions
from gspo_cli.compare.stats import RunReport, SeedGroup
from gspo_cli.compare.verdicts import STABLE

IGNORED = ("trainer.seed", "trainer.out_dir", "logging")
SETTINGS = ("algorithm", "model", "clip_low", "clip_high", "routing_replay", "steps_planned")
# Numbers shown inside another number's cell: the mean only (summary.json has their intervals).
BRIEF = ("clip_frac_low_mean", "clip_frac_high_mean", "entropy_first", "entropy_last",
         "heldout_best")  # fmt: skip


def seed_of(run: Run) -> int | None:
    seed = run.setting("trainer.seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def base_name(run: Run) -> str:
    """The recipe name without a suffix naming the run's own seed; the folder name if none."""
    name = str(run.setting("name") or run.name)
    seed = seed_of(run)
    if seed is None:
        return name
    stripped = re.sub(rf"[-_.](s|seed)[-_]?{seed}$", "", name)
    return stripped or name


def group_key(run: Run) -> str:
    """The recipe with the IGNORED keys removed and the name unsuffixed, as canonical JSON."""
    recipe = json.loads(json.dumps(run.recipe, default=str))  # a deep copy
    for dotted in IGNORED:
        *parents, last = dotted.split(".")
        node = recipe
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    recipe["name"] = base_name(run)
    return json.dumps(recipe, sort_keys=True, default=str)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    return {k: v for key, sub in node.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        return None
    return float(value)


def _aggregate(key: str, values: list[Any], seeds: int) -> Any:
    """One stats entry over the seeds: shared setting, step range, Estimate, or None."""
    if key in SETTINGS:
        return values[0]
    numbers = [n for v in values if (n := _number(v)) is not None]
    if not numbers:
        return None
    if key.endswith("_step") or key == "steps_done":
        return Spread(tuple(int(n) for n in numbers))
    return Estimate.of(numbers, seeds, brief=key in BRIEF)


def _aggregate_eval(reports: list[RunReport]) -> dict[str, dict[str, Any]]:
    """`gspo eval` results: the mean and t interval of each benchmark value over the seeds."""
    entries: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(label for r in reports for label in r.stats["eval"]):
        values = [r.stats["eval"][label]["value"] for r in reports if label in r.stats["eval"]]
        estimate = Estimate.of(values, len(reports))
        entries[label] = {"value": estimate, "ci_low": None, "ci_high": None}
    return entries


def group_view(reports: list[RunReport]) -> RunReport:
    keys = dict.fromkeys(k for r in reports for k in r.stats if k != "eval")
    stats = {k: _aggregate(k, [r.stats.get(k) for r in reports], len(reports)) for k in keys}
    stats["eval"] = _aggregate_eval(reports)
    return RunReport(reports[0].run, stats, issues=[])


def group_runs(reports: list[RunReport], problems: Problems) -> list[SeedGroup]:
    """Seed groups in the order their first run was given; seeds sorted within a group."""
    by_key: dict[str, list[RunReport]] = {}
    for report in reports:
        by_key.setdefault(group_key(report.run), []).append(report)
    groups = []
    for members in by_key.values():
        members.sort(key=lambda r: (seed_of(r.run) is None, seed_of(r.run) or 0))
        name, n = base_name(members[0].run), len(members)
        label = f"{name} ({n} seed{'s' if n > 1 else ''})"
        groups.append(SeedGroup(label, name, members, group_view(members)))
    _check_groups(groups, problems)
    return groups


def _check_groups(groups: list[SeedGroup], problems: Problems) -> None:
    """Warn about repeated seeds and same-named groups (naming what differs); unique labels."""
    for group in groups:
        repeated = sorted({s for s in group.seeds if group.seeds.count(s) > 1}, key=str)
        if repeated:
            problems.warning(
                "--group-seeds",
                f"{group.label}: seed {', '.join(map(str, repeated))} appears more than once; "
                "each run counts as one sample",
            )
    for group in groups:
        same = [g for g in groups if g.name == group.name]
        first = same[0]
        if first is group:
            continue
        ours, theirs = (
            _flat(json.loads(group_key(group.reports[0].run))),
            _flat(json.loads(group_key(first.reports[0].run))),
        )
        keys = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        problems.warning(
            "--group-seeds",
            f"{first.label} and {group.label} differ in {', '.join(keys)}: not merged",
        )
        group.label += f" #{same.index(group) + 1}"


def stability_text(group: SeedGroup) -> str:
    """The stability cell: "stable 3/3", or "unstable in 1/3 (seed 2: reward collapse at step
    25)" listing each unstable seed's issues without their details in brackets."""
    n = len(group.reports)
    unstable = [r for r in group.reports if r.issues]
    if not unstable:
        return f"{STABLE} {n}/{n}"
    found = [
        f"seed {r.run.setting('trainer.seed')}: "
        + ", ".join(i.detail.split(" (")[0] for i in r.issues)
        for r in unstable
    ]
    return f"unstable in {len(unstable)}/{n} ({'; '.join(found)})"


@dataclass(frozen=True)
class Band:
    """A group's curve: the mean over seeds at each step all of them logged, and the 95% t
    interval around it (low == high == mean with one seed). Arrays of one length."""

    xs: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int  # seeds that have the metric


def group_band(group: SeedGroup, key: str, x: str, window: int) -> Band | None:
    """The curve of `key` over the group's seeds (each smoothed first, held-out never), at the
    steps common to every seed that has the metric; x is the mean of the seeds' positions
    there (steps are equal; tokens and time differ a little). None when no seed has it."""
    curves = []
    for report in group.reports:
        series = metric_series(report.run, key)
        if series is None or len(series.steps) == 0:
            continue
        if not is_heldout(key):
            series = smooth(series, window)
        xs = x_positions(report.run, x, series.steps)
        if xs is not None:
            curves.append((series.steps, series.values, xs))
    if not curves:
        return None
    common = curves[0][0]
    for steps, _, _ in curves[1:]:
        common = np.intersect1d(common, steps)
    if len(common) == 0:
        return None
    pick = [np.searchsorted(steps, common) for steps, _, _ in curves]
    values = np.stack([v[i] for (_, v, _), i in zip(curves, pick, strict=True)])
    positions = np.stack([p[i] for (_, _, p), i in zip(curves, pick, strict=True)])
    values = np.where(np.isfinite(values), values, np.nan)  # NaN/inf: a gap in the mean
    mean = values.mean(axis=0)
    n = len(curves)
    half = t975(n - 1) * values.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(mean)
    return Band(positions.mean(axis=0), mean, mean - half, mean + half, n)


def _entry(values: list[Any], seeds: int) -> dict[str, Any]:
    """summary.json for one number: mean, interval, n, and each seed's value (None: absent)."""
    per_seed = [_number(v) for v in values]
    present = [v for v in per_seed if v is not None]
    estimate = Estimate.of(present, seeds)
    return {
        "mean": estimate.mean,
        "ci_low": estimate.ci_low,
        "ci_high": estimate.ci_high,
        "n": estimate.n,
        "values": per_seed,
    }


def group_summary(group: SeedGroup) -> dict[str, Any]:
    """A group as summary.json stores it: seeds, runs, verdicts, settings, and every number
    (run_stats keys, and `eval:<label>` for `gspo eval` results) over the seeds."""
    reports, n = group.reports, len(group.reports)
    keys = dict.fromkeys(k for r in reports for k in r.stats if k not in (*SETTINGS, "eval"))
    metrics: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [r.stats.get(key) for r in reports]
        if any(_number(v) is not None for v in values):
            metrics[key] = _entry(values, n)
    for label in group.view.stats["eval"]:
        values = [r.stats["eval"].get(label, {}).get("value") for r in reports]
        metrics[f"eval:{label}"] = _entry(values, n)
    return {
        "label": group.label,
        "name": group.name,
        "seeds": group.seeds,
        "runs": [r.run.name for r in reports],
        "paths": [str(r.run.path) for r in reports],
        "settings": {k: group.view.stats.get(k) for k in SETTINGS},
        "stable": sum(not r.issues for r in reports),
        "verdict": stability_text(group),
        "metrics": metrics,
    }
