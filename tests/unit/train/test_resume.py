"""Which recipe changes `--resume` accepts, and what it says about them (run-folder files only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe import Recipe
from gspo_cli.runs.folder import CHECKPOINTS, LATEST, RECIPE
from gspo_cli.train.run.guard import resume_advice
from gspo_cli.train.run.resume import check_resumable, resume_changes


def _yaml(**sections: dict[str, object]) -> str:
    return yaml.safe_dump(Recipe.model_validate(sections).model_dump(mode="json"))


def _run_with_checkpoint(tmp_path: Path) -> Path:
    (tmp_path / RECIPE).write_text(_yaml(optimizer={"lr": 1e-5}))
    (tmp_path / CHECKPOINTS).mkdir()
    (tmp_path / CHECKPOINTS / LATEST).write_text("step_000004")
    return tmp_path


def test_resume_accepts_what_cannot_break_the_run_and_says_what_changed(tmp_path: Path) -> None:
    run = _run_with_checkpoint(tmp_path)
    new = _yaml(
        optimizer={"lr": 5e-6, "schedule": "cosine", "warmup_steps": 3},
        trainer={
            "steps": 500, "checkpoint_every": 5, "keep_checkpoints": 4, "log_samples": 0,
            "on_collapse": "rollback", "max_rollbacks": 5, "rollback_lr_factor": 0.3,
            "max_bad_updates": 5,
        },
        eval={"every": 10},
        logging={"wandb": True, "wandb_project": "p", "console": "plain"},
    )  # fmt: skip
    check_resumable(run, new)  # no error
    lines = resume_changes(run, new)
    assert "resume: optimizer.lr 1e-05 -> 5e-06" in lines
    assert "resume: trainer.keep_checkpoints 2 -> 4" in lines
    assert len(lines) == 15  # one per key changed above


def test_resume_refuses_the_rest_naming_only_the_refused_keys(tmp_path: Path) -> None:
    run = _run_with_checkpoint(tmp_path)
    new = _yaml(optimizer={"lr": 5e-6, "betas": [0.9, 0.95]}, rollout={"group_size": 4})
    with pytest.raises(GspoError) as refused:
        check_resumable(run, new)
    named = str(refused.value).split(" differ ")[0]
    assert named == "--resume: optimizer.betas, rollout.group_size"


def test_a_key_added_since_the_run_was_made_is_no_change(tmp_path: Path) -> None:
    run = _run_with_checkpoint(tmp_path)
    saved = yaml.safe_load((run / RECIPE).read_text())
    del saved["cold_start"]["target"]  # a run folder from before cold_start.target existed
    (run / RECIPE).write_text(yaml.safe_dump(saved))
    current = _yaml(optimizer={"lr": 1e-5})
    check_resumable(run, current)  # no error
    assert resume_changes(run, current) == []
    with pytest.raises(GspoError, match=r"^--resume: cold_start.target differ"):
        check_resumable(run, _yaml(optimizer={"lr": 1e-5}, cold_start={"target": "answer"}))


def test_the_resume_advice_is_the_command_line_with_the_new_learning_rate() -> None:
    run = Path("runs/x")
    argv = ["train", "r.yaml", "--set", "optimizer.lr=1e-5", "--out", "runs/x", "--resume"]
    assert resume_advice(run, 5e-6, 1, argv) == (
        "gspo train r.yaml --out runs/x --set optimizer.lr=5e-06 --resume"
    )
    # A launched rank's argv has no --nproc; called from Python there is no command line.
    assert resume_advice(run, 5e-6, 2, ["train", "r.yaml"]) == (
        "gspo train r.yaml --nproc 2 --set optimizer.lr=5e-06 --resume"
    )
    assert resume_advice(run, 5e-6, 1, ["-q", "tests"]) == (
        "gspo train runs/x/recipe.yaml --out runs/x --set optimizer.lr=5e-06 --resume"
    )
