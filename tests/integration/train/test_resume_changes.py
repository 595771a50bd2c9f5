"""`--resume` with changed settings, and the guards' advice run as printed."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe import dump_recipe_yaml, load_recipe
from gspo_cli.train.engines.torch_engine import UpdateFailed
from gspo_cli.train.run.loop import run_loop
from gspo_cli.train.run.prepare import prepare_run
from tests.support.helpers import invoke_cli


def _metrics(run: Path) -> dict[int, dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


def _sets(*overrides: str) -> list[str]:
    return [item for o in overrides for item in ("--set", o)]


def test_resume_takes_harmless_changes_and_continues_the_wandb_run(
    tiny_recipe, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    recipe = str(
        tiny_recipe(
            trainer={"steps": 1, "checkpoint_every": 1},
            logging={"wandb": True, "wandb_mode": "offline"},
        )
    )
    out = tmp_path / "run"
    first = invoke_cli("train", recipe, "--out", str(out))
    assert first.returncode == 0, first.stderr[-2000:]

    refused = invoke_cli(
        "train", recipe, "--out", str(out), "--resume",
        *_sets("optimizer.lr=5e-7", "rollout.temperature=0.5"),
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--resume: rollout.temperature differ" in refused.stderr

    changes = (
        "optimizer.lr=5e-7", "trainer.steps=2", "trainer.checkpoint_every=2",
        "trainer.keep_checkpoints=3", "trainer.log_samples=1", "eval.every=2",
        "trainer.on_collapse=warn",
    )  # fmt: skip
    resumed = invoke_cli("train", recipe, "--out", str(out), "--resume", *_sets(*changes))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resume: optimizer.lr 1e-06 -> 5e-07" in resumed.stdout
    assert "resume: trainer.keep_checkpoints 2 -> 3" in resumed.stdout
    assert f"resume: loaded checkpoint {out / 'checkpoints' / 'step_000001'} (step 1)" in (
        resumed.stdout
    )
    # The restored optimizer and scheduler run at the new peak, not the checkpoint's.
    assert _metrics(out)[2]["lr"] == pytest.approx(5e-7)
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["optimizer"]["lr"] == 5e-7 and saved["trainer"]["steps"] == 2
    # Both processes logged to one wandb run: the id the run folder keeps.
    runs = list((out / "wandb").glob("offline-run-*"))
    kept = (out / "wandb_run_id").read_text().strip()
    assert len(runs) == 2 and {r.name.rsplit("-", 1)[1] for r in runs} == {kept}


class _FailingUpdates:
    """The training engine, except that update number `fail_at` raises as DeepSpeed's does
    after applying a non-finite gradient."""

    def __init__(self, inner: Any, fail_at: int) -> None:
        self.inner, self.fail_at, self.updates = inner, fail_at, 0

    def step(self, skip: bool = False) -> tuple[float, bool]:
        self.updates += 1
        if self.updates == self.fail_at:
            raise UpdateFailed("DeepSpeed applied an update with a non-finite gradient norm")
        result: tuple[float, bool] = self.inner.step(skip)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_guard_stop_prints_a_resume_command_that_works(
    tiny_recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    recipe_file = tiny_recipe(trainer={"steps": 2, "checkpoint_every": 1})
    recipe = load_recipe(recipe_file)
    out = tmp_path / "run"
    # The command line `gspo train` would run under, which the advice resumes.
    monkeypatch.setattr(sys, "argv", ["gspo", "train", str(recipe_file), "--out", str(out)])
    run = prepare_run(recipe, dump_recipe_yaml(recipe), out, False, Console(quiet=True))
    minibatches = recipe.algorithm.minibatches
    run.engine = _FailingUpdates(run.engine, fail_at=minibatches + 1)  # type: ignore[assignment]
    try:
        with pytest.raises(GspoError) as stopped:
            run_loop(run)  # step 2's first update fails: on_collapse stop
    finally:
        run.close()
    message = str(stopped.value)
    assert message.startswith("stopped at step 2: non finite: DeepSpeed applied"), message
    command = shlex.split(message.split("resume with: ", 1)[1])
    assert command == [
        "gspo", "train", str(recipe_file), "--out", str(out),
        "--set", "optimizer.lr=5e-07", "--resume",
    ]  # fmt: skip

    resumed = invoke_cli(*command[1:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resume: optimizer.lr 1e-06 -> 5e-07" in resumed.stdout
    assert "(step 1)" in resumed.stdout  # the checkpoint the stop line named
    assert _metrics(out)[2]["lr"] == pytest.approx(5e-7)
