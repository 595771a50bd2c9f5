"""Benchmark results written by `gspo eval` into a run folder, read leniently.

Files read: `<run>/results.json`, `<run>/eval/results.json` and `<run>/eval/*/results.json`.
Expected shape: {"benchmark": str, "checkpoint": str, "metrics": {name: entry}} where an entry is
either a number or an object with the value under "value" (else "mean", "estimate" or "score")
and the interval under "ci_low"/"ci_high" (else "low"/"high", "lower"/"upper", or a two-item
list "ci"/"interval"). Entries of any other shape are skipped. A missing "benchmark" is taken
from the folder name (`eval/<benchmark>/results.json`), else left out of the label.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.runs.folder import EVAL_DIR, RESULTS

VALUE_KEYS = ("value", "mean", "estimate", "score")
INTERVAL_KEYS = (("ci_low", "ci_high"), ("low", "high"), ("lower", "upper"))
INTERVAL_LISTS = ("ci", "interval")


@dataclass(frozen=True)
class EvalResult:
    """One benchmark metric with its interval (None when the file gives none)."""

    label: str
    value: float
    ci_low: float | None
    ci_high: float | None
    source: Path


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _interval(entry: dict[str, Any]) -> tuple[float | None, float | None]:
    for low_key, high_key in INTERVAL_KEYS:
        low, high = _num(entry.get(low_key)), _num(entry.get(high_key))
        if low is not None and high is not None:
            return low, high
    for key in INTERVAL_LISTS:
        pair = entry.get(key)
        if isinstance(pair, list | tuple) and len(pair) == 2:
            low, high = _num(pair[0]), _num(pair[1])
            if low is not None and high is not None:
                return low, high
    return None, None


def parse_entry(entry: Any) -> tuple[float, float | None, float | None] | None:
    """(value, ci_low, ci_high) of one metric entry, or None for a shape we do not know."""
    if (number := _num(entry)) is not None:
        return number, None, None
    if not isinstance(entry, dict):
        return None
    value = next((v for k in VALUE_KEYS if (v := _num(entry.get(k))) is not None), None)
    if value is None:
        return None
    return (value, *_interval(entry))


def _benchmark(data: dict[str, Any], path: Path, run_dir: Path) -> str:
    name = data.get("benchmark")
    if isinstance(name, str) and name:
        return name
    return path.parent.name if path.parent not in (run_dir, run_dir / EVAL_DIR) else ""


def read_results(run_dir: Path, warn: Callable[[Path, str], None]) -> list[EvalResult]:
    """Every metric of every results file in the run folder, labelled `<benchmark> <metric>`."""
    paths = sorted(
        {*run_dir.glob(RESULTS), *run_dir.glob(f"{EVAL_DIR}/{RESULTS}")}
        | set(run_dir.glob(f"{EVAL_DIR}/*/{RESULTS}"))
    )
    results: list[EvalResult] = []
    labels: set[str] = set()
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            warn(path, "not readable JSON; skipped")
            continue
        metrics = data.get("metrics") if isinstance(data, dict) else None
        if not isinstance(metrics, dict):
            warn(path, 'no "metrics" object; skipped')
            continue
        benchmark = _benchmark(data, path, run_dir)
        for name, entry in metrics.items():
            parsed = parse_entry(entry)
            if parsed is None:
                continue
            label = f"{benchmark} {name}".strip()
            if label in labels:  # the same benchmark scored twice: name the checkpoint
                label = f"{label} ({Path(str(data.get('checkpoint') or path.parent)).name})"
            labels.add(label)
            results.append(EvalResult(label, *parsed, source=path))
    return results
