"""Read run folders written by `gspo train`: recipe, metrics, held-out accuracy, eval results.

A folder is a run when it holds `metrics.jsonl` with at least one valid record. Corrupt lines
(a line cut by a kill, or JSON that is not an object with an integer `step`) are reported by file
and line number and skipped; the rest of the run is still compared.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.text import Text

from gspo_cli.compare.results import EvalResult, parse_entry, read_results
from gspo_cli.runs.collapse import HeldoutSize
from gspo_cli.runs.folder import EVAL_DIR, EVALS, EVENTS, METRICS, RECIPE, SUMMARY, iter_jsonl
from gspo_cli.runs.marker import lineage

# eval.jsonl's answer forms beside accuracy (docs/evaluation.md, "Form and substance")
HELDOUT_FORM_KEYS = ("answered", "accuracy_any_form", "ran_clean")
# eval.jsonl's accuracy of one environment of a mixture (recipe `environments`)
ENVIRONMENT_ACCURACY = re.compile(r"env/[^/]+/accuracy")


def is_environment_key(key: str) -> bool:
    """True for an environment's held-out accuracy in eval.jsonl (env/NAME/accuracy)."""
    return ENVIRONMENT_ACCURACY.fullmatch(key) is not None


class Problems:
    """Prints each problem at once as one line `error|warning: <where>: <what>` and keeps it."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.lines: list[str] = []

    def error(self, where: Path | str, what: str) -> None:
        self._emit("error", "red", where, what)

    def warning(self, where: Path | str, what: str) -> None:
        self._emit("warning", "yellow", where, what)

    def _emit(self, level: str, style: str, where: Path | str, what: str) -> None:
        self.lines.append(f"{level}: {where}: {what}")
        text = Text(f"{level}:", style=style)
        text.append(f" {where}: {what}")
        # soft_wrap keeps the problem on one line, so it can be grepped.
        self.console.print(text, soft_wrap=True, highlight=False)


@dataclass
class Run:
    """One run folder's records, sorted by step (one record per step)."""

    path: Path
    name: str
    recipe: dict[str, Any]
    records: list[dict[str, float]]
    heldout: list[tuple[int, float]] = field(default_factory=list)
    results: list[EvalResult] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # what the trainer's guards did
    heldout_size: HeldoutSize | None = None  # eval.jsonl's problems x samples, when logged
    # eval.jsonl's answer forms by step: answered, accuracy_any_form, ran_clean (when logged)
    heldout_forms: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # a branch's parent folder and step (gspo train --from): its records start there
    lineage: dict[str, Any] | None = None

    def setting(self, dotted: str) -> Any:
        """A recipe value such as `algorithm.name`, or None when the recipe lacks it."""
        node: Any = self.recipe
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    @property
    def algorithm(self) -> str:
        return str(self.setting("algorithm.name") or "?")

    @property
    def model(self) -> str:
        return str(self.setting("model.path") or "?")

    @property
    def steps_done(self) -> int:
        return int(self.records[-1]["step"])

    @property
    def steps_planned(self) -> int | None:
        steps = self.setting("trainer.steps")
        return int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None

    def has(self, key: str) -> bool:
        return any(key in record for record in self.records)

    def column(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the records that carry `key`; values may be NaN or inf."""
        rows = [r for r in self.records if key in r]
        steps = np.array([int(r["step"]) for r in rows], dtype=np.int64)
        return steps, np.array([r[key] for r in rows], dtype=np.float64)


def to_number(value: Any) -> float | None:
    """A JSON value as a float: numbers, and the strings "nan"/"inf"/"-inf" run_log writes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _parse_record(obj: dict[str, Any] | None) -> dict[str, float] | None:
    if obj is None:  # not a JSON object: a line cut by a kill, or garbage
        return None
    step = to_number(obj.get("step"))
    if step is None or not math.isfinite(step) or step != int(step) or step < 0:
        return None
    record = {k: n for k, v in obj.items() if (n := to_number(v)) is not None}
    record["step"] = float(int(step))
    return record


def read_records(path: Path, problems: Problems) -> list[dict[str, float]]:
    """Numeric records of a JSONL file by step; corrupt lines are reported and skipped.

    Stricter than run_folder.read_jsonl: a record also needs a valid `step`, and every skipped
    line is reported by number, since compare is where a damaged run gets noticed.
    """
    by_step: dict[int, dict[str, float]] = {}
    repeated = 0
    for number, obj in iter_jsonl(path):
        record = _parse_record(obj)
        if record is None:
            problems.warning(f"{path}:{number}", "corrupt line skipped (not a JSON record)")
            continue
        step = int(record["step"])
        repeated += step in by_step
        by_step[step] = record
    if repeated:  # a resume that did not truncate: the later record is the one that counts
        problems.warning(path, f"{repeated} steps recorded twice; the later record is used")
    return [by_step[s] for s in sorted(by_step)]


def _read_recipe(run_dir: Path, problems: Problems) -> dict[str, Any]:
    path = run_dir / RECIPE
    if not path.is_file():
        problems.warning(path, "missing; algorithm, model and planned steps are unknown")
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError) as exc:
        problems.warning(path, f"unreadable ({type(exc).__name__}); recipe details are unknown")
        return {}
    return data if isinstance(data, dict) else {}


Records = list[dict[str, float]]


def _read_heldout(run_dir: Path, records: Records, evals: Records, problems: Problems) -> Any:
    """Held-out accuracy by step: summary.json, then metrics, then eval.jsonl (later wins)."""
    by_step: dict[int, float] = {}
    try:
        summary = json.loads((run_dir / SUMMARY).read_text(encoding="utf-8"))
        for step, value in dict(summary.get("heldout_accuracy") or {}).items():
            if (number := to_number(value)) is not None and str(step).isdigit():
                by_step[int(step)] = number
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, AttributeError):
        problems.warning(run_dir / SUMMARY, "unreadable; skipped")
    for record in records:
        if "heldout_accuracy" in record:
            by_step[int(record["step"])] = record["heldout_accuracy"]
    for record in evals:
        if "accuracy" in record:
            by_step[int(record["step"])] = record["accuracy"]
    return sorted(by_step.items())


CURVE_PREFIX = "curve/"  # curve/BENCHMARK/METRIC: `gspo eval RUN --steps` (eval/curve.py)


def _curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The benchmark curves `gspo eval RUN --steps` wrote in the run folder: each avg@k by
    step, as curve/BENCHMARK/avg@k."""
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob(f"{EVAL_DIR}/*/curve.json")):
        try:
            curve = json.loads(path.read_text(encoding="utf-8"))
            points = [(int(p["step"]), p["metrics"]) for p in curve["points"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a curve being written, or not ours
        for step, metrics in points:
            for name, entry in metrics.items():
                parsed = parse_entry(entry)
                if name.startswith("avg@") and parsed is not None:
                    key = f"{CURVE_PREFIX}{curve.get('benchmark', path.parent.name)}/{name}"
                    found.setdefault(key, []).append((step, parsed[0]))
    return found


def _heldout_forms(evals: Records) -> dict[str, list[tuple[int, float]]]:
    """eval.jsonl's answer forms beside held-out accuracy (train/run/heldout.py), by step."""
    forms: dict[str, list[tuple[int, float]]] = {}
    environments = [k for k in dict.fromkeys(k for r in evals for k in r) if is_environment_key(k)]
    for key in (*HELDOUT_FORM_KEYS, *environments):
        points = [(int(r["step"]), r[key]) for r in evals if key in r]
        if points:
            forms[key] = points
    return forms


def _heldout_size(evals: list[dict[str, float]]) -> HeldoutSize | None:
    """The size of the run's held-out evaluations (eval.jsonl's last record that names it),
    which the collapse detector weighs a drop against; None for runs that did not log it."""
    size = None
    for record in evals:
        n, k = to_number(record.get("num_problems")), to_number(record.get("samples"))
        if n is not None and k is not None and n >= 1 and k >= 1:
            size = HeldoutSize(int(n), int(k))
    return size


def _not_a_run(path: Path, problems: Problems) -> None:
    if (path / RECIPE).is_file():
        problems.error(path, f"no {METRICS} yet (the run has not logged a step); skipped")
        return
    nested = sorted(p.name for p in path.iterdir() if (p / METRICS).is_file())
    hint = f" (it holds {len(nested)} runs: pass them, e.g. {path}/*)" if nested else ""
    problems.error(path, f"not a run folder (no {METRICS} or {RECIPE}); skipped{hint}")


def load_run(path: Path, problems: Problems) -> Run | None:
    """The run in `path`, or None after printing why it cannot be compared."""
    if not path.exists():
        problems.error(path, "no such folder; skipped")
        return None
    if not path.is_dir():
        problems.error(path, "not a folder (pass a run folder written by `gspo train`); skipped")
        return None
    if not (path / METRICS).is_file():
        _not_a_run(path, problems)
        return None
    try:
        records = read_records(path / METRICS, problems)
    except OSError as exc:
        problems.error(path / METRICS, f"unreadable ({exc.strerror or exc}); skipped")
        return None
    if not records:
        problems.error(path / METRICS, "no valid record; skipped")
        return None
    recipe = _read_recipe(path, problems)
    evals = read_records(path / EVALS, problems) if (path / EVALS).is_file() else []
    parent = lineage(path)
    if parent is not None:  # a branch is drawn from its parent's step on, not its copies
        records = [r for r in records if r["step"] >= parent["step"]]
        evals = [r for r in evals if r["step"] >= parent["step"]]
    heldout = _read_heldout(path, records, evals, problems)
    events = [e for _, e in iter_jsonl(path / EVENTS) if e] if (path / EVENTS).is_file() else []
    results = read_results(path, problems.warning)
    size = _heldout_size(evals)
    forms = {**_heldout_forms(evals), **_curves(path)}
    return Run(path, path.name, recipe, records, heldout, results, events, size, forms, parent)


def load_runs(
    run_dirs: list[Path], baseline: Path | None, problems: Problems
) -> tuple[list[Run], Run | None]:
    """The valid runs in the given order, and the baseline (default: the first valid run).

    A baseline that is not among `run_dirs` is loaded too and compared as the first run.
    """
    paths = list(dict.fromkeys(Path(p) for p in run_dirs))
    if len(paths) < len(run_dirs):
        problems.warning("runs", "a folder was given twice; it is compared once")
    resolved = [p.resolve() for p in paths]
    if baseline is not None and Path(baseline).resolve() not in resolved:
        paths.insert(0, Path(baseline))
        resolved.insert(0, Path(baseline).resolve())
    runs: list[Run] = []
    base: Run | None = None
    for path, real in zip(paths, resolved, strict=True):
        run = load_run(path, problems)
        if run is None:
            continue
        runs.append(run)
        if baseline is not None and real == Path(baseline).resolve():
            base = run
    if baseline is not None and base is None and runs:
        problems.warning(baseline, f"baseline not usable; the first run ({runs[0].path}) is used")
    _unique_names(runs)
    return runs, base or (runs[0] if runs else None)


def _unique_names(runs: list[Run]) -> None:
    """Folder names label the runs; clashing names get their parent folder, then a number."""
    clashing = {r.name for r in runs if sum(o.name == r.name for o in runs) > 1}
    for run in runs:
        if run.name in clashing:
            run.name = f"{run.path.resolve().parent.name}/{run.path.name}"
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name}#{seen[run.name]}"
