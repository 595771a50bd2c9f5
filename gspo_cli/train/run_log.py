"""The run folder's record: metrics.jsonl, samples.jsonl, eval.jsonl, and optional wandb."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from gspo_cli.atomic import write_text_atomic

METRICS, SAMPLES, EVALS = "metrics.jsonl", "samples.jsonl", "eval.jsonl"


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so that compare can flag them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RunLog:
    """Appends one JSON line per record, flushed and fsynced (a kill loses at most one line)."""

    def __init__(self, run_dir: Path, wandb_run: Any = None, *, enabled: bool = True) -> None:
        self.run_dir = run_dir
        self.wandb_run = wandb_run
        self.enabled = enabled  # only rank 0 writes the run folder

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()

    def append(self, name: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps({k: _clean(v) for k, v in record.items()}, allow_nan=False)
        with open(self.run_dir / name, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.append(METRICS, {"step": step, **values})
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def evaluation(self, step: int, values: dict[str, float]) -> None:
        self.append(EVALS, {"step": step, **values})
        if self.wandb_run is not None:
            self.wandb_run.log({f"heldout/{k}": v for k, v in values.items()}, step=step)

    def evaluations(self) -> dict[int, float]:
        """Held-out accuracy by step from eval.jsonl (what a resumed run already measured)."""
        path = self.run_dir / EVALS
        found: dict[int, float] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                    found[int(record["step"])] = float(record["accuracy"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
        return found

    def truncate_after(self, step: int) -> None:
        """On resume: drop records of steps after the checkpoint, so none appear twice."""
        if not self.enabled:
            return
        for name in (METRICS, SAMPLES, EVALS):
            path = self.run_dir / name
            if not path.is_file():
                continue
            kept = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line).get("step", 0) <= step:
                        kept.append(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
            write_text_atomic(path, "".join(k + "\n" for k in kept))


def start_wandb(run_dir: Path, project: str, mode: str, name: str, config: dict[str, Any]) -> Any:
    import wandb

    return wandb.init(
        project=project, mode=mode, name=name, dir=str(run_dir), config=config, resume="allow"
    )
