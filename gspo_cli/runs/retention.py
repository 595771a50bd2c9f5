"""Which checkpoints a run keeps (`trainer.keep_checkpoints`, `keep_best`, `keep_every`), and
its best one (`gspo export RUN --best`).

Kept: the newest `keep_checkpoints` (the newest is what `--resume` takes), the best `keep_best`
by `best_metric` (its value in metrics.jsonl at the checkpoint's step; a checkpoint whose step
has none is not ranked; ties go to the later step), every checkpoint at a multiple of
`keep_every` steps, and the one a rollback returns to. The rest is deleted after each save.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    METRICS,
    STEP_GLOB,
    read_jsonl,
    saved_recipe_section,
)


@dataclass(frozen=True)
class Retention:
    last: int = 2
    best: int = 0
    metric: str = "heldout_accuracy"
    mode: Literal["max", "min"] = "max"
    every: int = 0


STEP_NAME = re.compile(r"step_(\d+)")


def step_of(folder: Path) -> int:
    """step_000120 -> 120."""
    return int(folder.name.rpartition("_")[2])


def metric_by_step(run_dir: Path, metric: str) -> dict[int, float]:
    """`metric`'s finite values in the run's metrics.jsonl, by step (the last record of a step
    wins: a rolled-back step is logged again)."""
    found: dict[int, float] = {}
    for record in read_jsonl(run_dir / METRICS):
        value, step = record.get(metric), record.get("step")
        if isinstance(step, int) and isinstance(value, int | float) and math.isfinite(value):
            found[step] = float(value)
    return found


def ranked(folders: list[Path], scores: dict[int, float], mode: str) -> list[Path]:
    """The folders whose step has a score, best first (ties: the later step first)."""
    sign = 1.0 if mode == "max" else -1.0
    scored = [f for f in folders if step_of(f) in scores]
    return sorted(scored, key=lambda f: (sign * scores[step_of(f)], step_of(f)), reverse=True)


def kept_by(folders: list[Path], policy: Retention, scores: dict[int, float]) -> set[Path]:
    """The checkpoints `policy` keeps among `folders` (step_* folders, any order)."""
    ordered = sorted(folders, key=step_of)
    keep = set(ordered[-policy.last :])
    if policy.best:
        keep |= set(ranked(ordered, scores, policy.mode)[: policy.best])
    if policy.every:
        keep |= {f for f in ordered if step_of(f) % policy.every == 0}
    return keep


def checkpoints(root: Path) -> list[Path]:
    """The checkpoint folders under `root`, oldest first (a user's `step_5_copy` is none)."""
    if not root.is_dir():
        return []
    found = [f for f in root.glob(STEP_GLOB) if f.is_dir() and STEP_NAME.fullmatch(f.name)]
    return sorted(found, key=step_of)


def best_checkpoint(run_dir: Path) -> Path:
    """The run's best kept checkpoint by its recipe's `trainer.best_metric` and `best_mode`
    (GspoError, one line, when none of its checkpoints has that metric at its step)."""
    trainer = saved_recipe_section(run_dir, "trainer")
    metric = str(trainer.get("best_metric", "heldout_accuracy"))
    mode = "min" if trainer.get("best_mode") == "min" else "max"
    folders = checkpoints(run_dir / CHECKPOINTS)
    if not folders:
        raise GspoError(f"--best: {run_dir} holds no checkpoint")
    best = ranked(folders, metric_by_step(run_dir, metric), mode)
    if not best:
        steps = ", ".join(str(step_of(f)) for f in folders)
        raise GspoError(
            f"--best: none of the checkpoints of {run_dir} (steps {steps}) has {metric} in "
            f"{METRICS} at its step (trainer.best_metric; heldout_accuracy is logged every "
            "eval.every steps)"
        )
    return best[0]
