"""The trackers a run reports to (`logging.backends`): wandb, tensorboard, mlflow, trackio, each
through its own library, every one beside the run folder's own record (which stays the source
of truth: `gspo compare` reads it).

Each gets every metric of metrics.jsonl by step, held-out results as `heldout/NAME`, and the
recipe (wandb and trackio: the config; mlflow: flattened params; tensorboard: a text). Their
files go into the run folder (`tensorboard/`, `mlruns/` unless `logging.mlflow_uri` names a
server or store, `trackio/`, `wandb/`). A resumed run continues its tracker run where the
backend can: wandb and mlflow by the run id kept in the run folder, trackio by the run's name,
tensorboard by purging the steps after the checkpoint; a branch (`--from`) starts a tracker
run of its own whose config (mlflow: params) names its parent and step. A tracker that fails
mid-run is a warning, once, and is off for the rest of the run: the run never stops for it.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe import Recipe, dump_recipe_yaml
from gspo_cli.runs.folder import write_text_atomic
from gspo_cli.runs.marker import lineage

MLFLOW_ID = "mlflow_run_id"  # in the run folder: the mlflow run a resume continues
PARAM_CHARS = 500  # mlflow's limit on a param's value
MLFLOW_HTTP = {  # a tracking server's deadlines (a user's own settings win)
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers among `values` (JSON keeps NaN as strings; trackers want floats)."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _flat(tree: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(tree)[:PARAM_CHARS]}


class Tracker:
    """One backend; its calls never raise: a failure is warned about once and turns it off."""

    name = "tracker"

    def __init__(self, console: Console) -> None:
        self.console = console
        self.failed: str | None = None

    def log(self, values: dict[str, Any], step: int) -> None:
        self._safe(self._log, _numbers(values), step)

    def samples(self, rows: list[dict[str, Any]], step: int) -> None:
        """A step's samples as a table (prompt, answer, completion, reward), as strings."""
        table = [{k: v if isinstance(v, int | float) else str(v) for k, v in row.items()}
                 for row in rows]  # fmt: skip
        self._safe(self._samples, table, step)

    def close(self) -> None:
        self._safe(self._close)

    def _samples(self, rows: list[dict[str, Any]], step: int) -> None:
        """Where the backend has tables; none by default."""

    def _safe(self, call: Any, *args: Any) -> None:
        if self.failed is not None:
            return
        try:
            call(*args)
        except Exception as exc:  # a tracker is a library's network and disk: never the run's
            lines = str(exc).strip().splitlines()
            self.failed = f"{type(exc).__name__}: {lines[0] if lines else ''}"
            self.console.print(
                f"warning: the {self.name} tracker failed ({self.failed}); it is off for the "
                "rest of the run (metrics.jsonl keeps everything)",
                highlight=False,
                soft_wrap=True,
            )

    def _log(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, console: Console, run: Any) -> None:
        super().__init__(console)
        self.run = run

    def _log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def _samples(self, rows: list[dict[str, Any]], step: int) -> None:
        import wandb

        columns = list(rows[0])
        table = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        self.run.log({"samples": table}, step=step)

    def _close(self) -> None:
        self.run.finish()


class TensorboardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, console: Console, run_dir: Path, recipe_yaml: str, resumed_at: int) -> None:
        super().__init__(console)
        from torch.utils.tensorboard import SummaryWriter

        # a resume rewrites the steps after its checkpoint: purge what a killed run wrote there
        purge = resumed_at + 1 if resumed_at else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        if not resumed_at:
            self.writer.add_text("recipe", f"```yaml\n{recipe_yaml}\n```", 0)

    def _log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def _samples(self, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(rows[0])
        lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
        for row in rows:
            cells = (str(row.get(c, "")).replace("|", "\\|").replace("\n", " ") for c in columns)
            lines.append("| " + " | ".join(cells) + " |")
        self.writer.add_text("samples", "\n".join(lines), step)

    def _close(self) -> None:
        self.writer.close()


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(
        self, console: Console, run_dir: Path, uri: str | None, project: str, name: str,
        config: dict[str, Any], resume: bool,
    ) -> None:  # fmt: skip
        super().__init__(console)
        # the file store is mlflow's local default here (mlflow 3 wants an opt-in for it)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # a server that does not answer: a line within seconds, not mlflow's minutes of retries
        for key, value in MLFLOW_HTTP.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient((run_dir / "mlruns").resolve().as_uri() if uri is None else uri)
        kept = run_dir / MLFLOW_ID
        if resume and kept.is_file() and (run_id := kept.read_text(encoding="utf-8").strip()):
            self.run_id = run_id
            return
        found = self.client.get_experiment_by_name(project)
        experiment = found.experiment_id if found else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment, run_name=name).info.run_id
        write_text_atomic(kept, self.run_id)
        params = list(_flat(config).items())
        from mlflow.entities import Param

        for start in range(0, len(params), 100):  # mlflow takes at most 100 a batch
            batch = [Param(k, v) for k, v in params[start : start + 100]]
            self.client.log_batch(self.run_id, params=batch)

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def _samples(self, rows: list[dict[str, Any]], step: int) -> None:
        columns = {c: [r.get(c) for r in rows] for c in rows[0]}
        self.client.log_table(
            self.run_id, data=columns, artifact_file=f"samples/step_{step:06d}.json"
        )

    def _close(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(
        self, console: Console, run_dir: Path, project: str, name: str, config: dict[str, Any],
    ) -> None:  # fmt: skip
        super().__init__(console)
        # trackio reads its folder when imported: the run folder's, before the import
        os.environ["TRACKIO_DIR"] = str((run_dir / "trackio").resolve())
        import trackio

        self.trackio = trackio
        trackio.init(project=project, name=name, config=config, resume="allow", embed=False)

    def _log(self, values: dict[str, float], step: int) -> None:
        self.trackio.log(values, step=step)

    def _samples(self, rows: list[dict[str, Any]], step: int) -> None:
        import pandas as pd

        self.trackio.log({"samples": self.trackio.Table(dataframe=pd.DataFrame(rows))}, step=step)

    def _close(self) -> None:
        self.trackio.finish()


def start_trackers(
    recipe: Recipe, run_dir: Path, resumed_at: int, console: Console
) -> list[Tracker]:
    """The run's trackers (`logging.backends`), started, or continued from the checkpoint at
    step `resumed_at` (0: a new run); GspoError when one cannot start."""
    from gspo_cli.train.run.log import start_wandb

    cfg, config = recipe.logging, recipe.model_dump(mode="json")
    backends, recipe_yaml = cfg.trackers(), dump_recipe_yaml(recipe)
    parent = lineage(run_dir)
    if parent is not None:  # a branch (gspo train --from): its tracker run names its parent
        config = {**config, "lineage": parent}
    resume = resumed_at > 0
    trackers: list[Tracker] = []
    for backend in backends:
        try:
            if backend == "wandb":
                run = start_wandb(run_dir, cfg.wandb_project, cfg.wandb_mode, recipe.name, config,
                                  resume=resume)  # fmt: skip
                trackers.append(WandbTracker(console, run))
            elif backend == "tensorboard":
                trackers.append(TensorboardTracker(console, run_dir, recipe_yaml, resumed_at))
            elif backend == "mlflow":
                trackers.append(MlflowTracker(console, run_dir, cfg.mlflow_uri, cfg.project,
                                              recipe.name, config, resume))  # fmt: skip
            elif backend == "trackio":
                trackers.append(TrackioTracker(console, run_dir, cfg.project, recipe.name, config))
        except Exception as exc:  # a server unreachable, a store unwritable: before training
            lines = str(exc).strip().splitlines()
            raise GspoError(
                f"logging.backends: {backend} could not start ({type(exc).__name__}: "
                f"{lines[0] if lines else ''})"
            ) from None
    return trackers
