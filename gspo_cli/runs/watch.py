"""`gspo watch RUN`: what a run folder says now, read while a run writes it (no lock taken).

Every file is read whole and tolerantly: a JSONL line being appended is skipped until it is
complete, a recipe being replaced is read on the next refresh. Whether a writer is alive comes
from the folder's lock file, which names its holder (runs/lock.py): present with a live pid on
this host means a run is writing; absent (or its holder gone, a killed run) means it is not.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    EVALS,
    EVENTS,
    LATEST,
    LOCK,
    METRICS,
    SAMPLES,
    read_jsonl,
    saved_recipe_section,
)
from gspo_cli.runs.marker import is_run_folder


@dataclass
class RunSnapshot:
    """One reading of a run folder."""

    folder: Path
    metrics: list[dict[str, Any]]  # metrics.jsonl, one record per step, in order
    heldout: list[dict[str, Any]]  # eval.jsonl
    samples: list[dict[str, Any]]  # samples.jsonl records of the last step that has any
    events: list[dict[str, Any]]  # the guard's events (events.jsonl): warnings, rollbacks, stops
    total_steps: int | None  # trainer.steps of the saved recipe
    on_collapse: str  # trainer.on_collapse of the saved recipe
    latest_checkpoint: str | None
    writer: dict[str, Any] | None = field(default=None)  # the live writer's pid, host, command

    @property
    def step(self) -> int:
        return int(self.metrics[-1]["step"]) if self.metrics else 0

    def series(self, key: str) -> list[float]:
        """`key` over the steps that logged it, as floats (strings such as "nan" skipped)."""
        return [float(r[key]) for r in self.metrics if isinstance(r.get(key), int | float)]

    def eta_s(self) -> float | None:
        """Seconds left at the mean step time of the last 10 steps (None when not known)."""
        times = self.series("time_step_s")[-10:]
        if not times or self.total_steps is None:
            return None
        return max(0, self.total_steps - self.step) * sum(times) / len(times)


def _writer(folder: Path) -> dict[str, Any] | None:
    """The lock file's holder when it is alive on this host (a live run), else None."""
    try:
        holder = json.loads((folder / LOCK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(holder, dict) or holder.get("host") != socket.gethostname():
        return None
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a killed run's lock file
    except PermissionError:
        pass  # alive, another user's
    return holder


def _last_samples(path: Path) -> list[dict[str, Any]]:
    records = read_jsonl(path)
    if not records:
        return []
    last = records[-1].get("step")
    return [r for r in records if r.get("step") == last]


def read_snapshot(folder: Path) -> RunSnapshot:
    """The run folder's state now; GspoError (one line) when `folder` is not a run folder."""
    if not is_run_folder(folder):
        raise GspoError(f"{folder} is not a gspo run folder (no run marker or checkpoints)")
    trainer = saved_recipe_section(folder, "trainer")
    steps = trainer.get("steps")
    latest = folder / CHECKPOINTS / LATEST
    try:
        checkpoint: str | None = latest.read_text(encoding="utf-8").strip() or None
    except OSError:
        checkpoint = None
    return RunSnapshot(
        folder=folder,
        metrics=read_jsonl(folder / METRICS),
        heldout=read_jsonl(folder / EVALS),
        samples=_last_samples(folder / SAMPLES),
        events=read_jsonl(folder / EVENTS),
        total_steps=steps if isinstance(steps, int) else None,
        on_collapse=str(trainer.get("on_collapse", "stop")),
        latest_checkpoint=checkpoint,
        writer=_writer(folder),
    )
