"""Checkpoint round trip and atomicity (no CLI, no training run)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.runs.retention import Retention
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.schedule import lr_lambda
from gspo_cli.train.engines.settings import engine_settings, optimizer_steps
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from gspo_cli.train.step.sampler import PromptSampler


def _trained_engine() -> tuple[TorchEngine, object]:
    model, tokenizer = create_builtin("tiny-dense", seed=3)
    engine = TorchEngine(model, engine_settings(Recipe()), LOCAL)
    ids = torch.randint(0, 90, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    engine.step()
    return engine, tokenizer


def test_round_trip_restores_weights_optimizer_scheduler_rng_and_data_position(
    tmp_path: Path,
) -> None:
    engine, tokenizer = _trained_engine()
    sampler = PromptSampler(10, seed=1)
    sampler.next(13)  # into the second epoch
    torch.manual_seed(5)
    random.seed(5)
    save_checkpoint(
        tmp_path, 7, engine, tokenizer, {"sampler": sampler.state_dict()}, keep=Retention(2)
    )
    expected_draws = (torch.rand(3), random.random(), sampler.next(4))

    folder = latest_checkpoint(tmp_path)
    assert folder is not None and folder.name == "step_000007"
    state = load_trainer_state(folder)
    model2, _ = create_builtin("tiny-dense", seed=99)  # different init, overwritten below
    engine2 = TorchEngine(model2, engine_settings(Recipe()), LOCAL)
    engine2.load_state(folder)
    sampler2 = PromptSampler(10, seed=1)
    sampler2.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])

    for (name, p1), (_, p2) in zip(
        engine.model.named_parameters(), model2.named_parameters(), strict=True
    ):
        assert torch.equal(p1, p2), name
    opt1, opt2 = engine.optimizer.state_dict(), engine2.optimizer.state_dict()
    for key in opt1["state"]:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt1["state"][key][field], opt2["state"][key][field])
    assert (
        engine2.scheduler.state_dict()["last_epoch"] == engine.scheduler.state_dict()["last_epoch"]
    )
    assert state["step"] == 7
    draws = (torch.rand(3), random.random(), sampler2.next(4))
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]


def test_a_save_killed_midway_leaves_the_last_good_checkpoint(tmp_path: Path) -> None:
    engine, tokenizer = _trained_engine()
    save_checkpoint(tmp_path, 1, engine, tokenizer, {}, keep=Retention(3))
    half_written = tmp_path / ".step_000002.tmp"  # what a kill during the next save leaves
    half_written.mkdir()
    (half_written / "model.safetensors").write_bytes(b"partial")
    folder = latest_checkpoint(tmp_path)
    assert folder is not None and folder.name == "step_000001"
    assert not half_written.exists()


def test_keep_prunes_oldest(tmp_path: Path) -> None:
    engine, tokenizer = _trained_engine()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, engine, tokenizer, {}, keep=Retention(2))
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000003"]


def test_corrupted_state_is_one_clear_error(tmp_path: Path) -> None:
    engine, tokenizer = _trained_engine()
    folder = save_checkpoint(tmp_path, 1, engine, tokenizer, {}, keep=Retention(1))
    (folder / "trainer_state.pt").write_bytes(b"\x00not a checkpoint")
    with pytest.raises(GspoError, match="is corrupted"):
        load_trainer_state(folder)
    (folder / "optimizer.pt").write_bytes(b"garbage")
    with pytest.raises(GspoError, match=r"optimizer\.pt is corrupted"):
        engine.load_state(folder)
    (folder / "trainer_state.pt").unlink()
    with pytest.raises(GspoError, match="incomplete or missing"):
        latest_checkpoint(tmp_path)


def test_pruning_keeps_the_checkpoint_a_rollback_needs(tmp_path: Path) -> None:
    engine, tokenizer = _trained_engine()
    for step in range(6):  # checkpoint_every 1, keep 2, on_collapse rollback
        save_checkpoint(
            tmp_path, step, engine, tokenizer, {}, keep=Retention(2), keep_before=step - 2
        )
    # a collapse found at step 6 goes back to step 3 or before: step_3 survived pruning
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [
        "step_000003",
        "step_000004",
        "step_000005",
    ]


def test_pruning_keeps_the_best_by_the_runs_metrics_and_every_kth(tmp_path: Path) -> None:
    engine, tokenizer = _trained_engine()
    root, log = tmp_path / "checkpoints", tmp_path / "metrics.jsonl"
    accuracy = [0.1, 0.6, 0.2, 0.3, 0.4, 0.5]
    policy = Retention(last=1, best=1, every=4)
    for step, value in enumerate(accuracy):
        with log.open("a") as handle:  # the loop logs a step's metrics before its checkpoint
            handle.write(json.dumps({"step": step, "heldout_accuracy": value}) + "\n")
        save_checkpoint(root, step, engine, tokenizer, {}, keep=policy)
    kept = sorted(p.name for p in root.glob("step_*"))
    assert kept == ["step_000000", "step_000001", "step_000004", "step_000005"]


def test_a_restored_scheduler_takes_the_new_peak_learning_rate(tmp_path: Path) -> None:
    """Resume with a changed optimizer.lr and schedule: load_state brings back the old peak
    (LambdaLR's base_lrs and the optimizer's lr); set_peak_lr must win, now and later."""
    engine, tokenizer = _trained_engine()  # lr 1e-6 (default), constant, 1 step taken
    folder = save_checkpoint(tmp_path, 1, engine, tokenizer, {}, keep=Retention(1))
    new = Recipe.model_validate(
        {
            "optimizer": {"lr": 5e-4, "schedule": "linear", "warmup_steps": 0},
            "trainer": {"steps": 3},
        }
    )
    model2, _ = create_builtin("tiny-dense", seed=3)
    engine2 = TorchEngine(model2, engine_settings(new), LOCAL)
    engine2.load_state(folder)
    assert engine2.lr == pytest.approx(1e-6)  # the checkpoint's, until told otherwise
    engine2.set_peak_lr(5e-4)
    decay = lr_lambda("linear", 0, optimizer_steps(new), 0.0)
    assert engine2.lr == pytest.approx(5e-4 * decay(1))
    ids = torch.randint(0, 90, (2, 8))
    model2(input_ids=ids, labels=ids).loss.backward()
    engine2.step()
    assert engine2.lr == pytest.approx(5e-4 * decay(2))
