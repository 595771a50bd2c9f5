"""The run folder's record: metrics.jsonl, samples.jsonl, eval.jsonl, events.jsonl, the
summary.json a run ends with, and the trackers beside it (train/run/trackers.py)."""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gspo_cli.runs.folder import (
    EVALS,
    EVENTS,
    METRICS,
    SAMPLES,
    SUMMARY,
    WANDB_ID,
    append_jsonl,
    read_jsonl,
    write_text_atomic,
)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so that compare can flag them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RunLog:
    """Appends one JSON line per record, flushed and fsynced (a kill loses at most one line)."""

    def __init__(self, run_dir: Path, trackers: list[Any] | None = None, *, enabled: bool = True):
        self.run_dir = run_dir
        self.trackers = list(trackers or [])  # train/run/trackers.py: never raise
        self.enabled = enabled  # only rank 0 writes the run folder

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def append(self, name: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_jsonl(self.run_dir / name, {k: _clean(v) for k, v in record.items()})

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.append(METRICS, {"step": step, **values})
        for tracker in self.trackers:
            tracker.log(values, step)

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        """A step's logged samples: samples.jsonl, and a table in the trackers that have one."""
        for record in records:
            self.append(SAMPLES, record)
        if records and self.enabled:
            for tracker in self.trackers:
                tracker.samples(records, step)

    def evaluation(self, step: int, values: dict[str, float]) -> None:
        self.append(EVALS, {"step": step, **values})
        for tracker in self.trackers:
            tracker.log({f"heldout/{k}": v for k, v in values.items()}, step)

    def event(self, record: dict[str, Any]) -> None:
        """A guard event (skipped updates, collapse, rollback, stop): kept across rollbacks
        and resumes, since it explains why steps were redone or the run stopped."""
        self.append(EVENTS, record)

    def events(self) -> list[dict[str, Any]]:
        path = self.run_dir / EVENTS
        return list(read_jsonl(path)) if path.is_file() else []

    def evaluations(self) -> dict[int, float]:
        """Held-out accuracy by step from eval.jsonl (what a resumed run already measured)."""
        found: dict[int, float] = {}
        for record in read_jsonl(self.run_dir / EVALS):
            try:
                found[int(record["step"])] = float(record["accuracy"])
            except (KeyError, TypeError, ValueError):
                continue  # a record without a usable accuracy
        return found

    def truncate_after(self, step: int) -> None:
        """On resume: drop records of steps after the checkpoint, so none appear twice."""
        if not self.enabled:
            return
        for name in (METRICS, SAMPLES, EVALS):
            path = self.run_dir / name
            if not path.is_file():
                continue
            # Torn lines go too; kept records are rewritten exactly as append_jsonl wrote them.
            kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    heldout: dict[int, float] = field(default_factory=dict)  # step -> accuracy


def write_summary(run_dir: Path, result: TrainResult, events: list[dict[str, Any]]) -> None:
    """summary.json: the steps done, held-out accuracy by step and the guard's events."""
    summary = {
        "steps": result.steps_done,
        "heldout_accuracy": {str(k): v for k, v in result.heldout.items()},
        "events": events,
    }
    write_text_atomic(run_dir / SUMMARY, json.dumps(summary, indent=2))


def start_wandb(
    run_dir: Path, project: str, mode: str, name: str, config: dict[str, Any], *, resume: bool
) -> Any:
    """The run's wandb run: a resume continues the one whose id the run folder keeps."""
    import wandb

    return wandb.init(
        project=project,
        mode=mode,
        name=name,
        dir=str(run_dir),
        config=config,
        id=wandb_run_id(run_dir, resume),
        resume="allow",
    )


def wandb_run_id(run_dir: Path, resume: bool) -> str:
    """The id kept in the run folder (on resume), else a new one, saved before wandb starts so
    that a kill at any point leaves the id its resume needs."""
    path = run_dir / WANDB_ID
    if resume and path.is_file() and (kept := path.read_text(encoding="utf-8").strip()):
        return kept
    new = secrets.token_hex(4)  # wandb ids: short, lower-case letters and digits
    write_text_atomic(path, new)
    return new
