"""The training guards end to end on the tiny cold-started model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gspo_cli.errors import GspoError
from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.train.checkpoint import save_checkpoint
from gspo_cli.train.distributed import LOCAL
from gspo_cli.train.engine import TorchEngine
from tests.conftest import invoke_cli


def _events(run: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def _all_finite(folder: Path) -> bool:
    return all(
        bool(torch.isfinite(t).all()) for t in load_file(folder / "model.safetensors").values()
    )


@pytest.mark.parametrize("on_collapse", ["stop", "rollback"])
def test_a_diverging_run_ends_with_finite_weights_and_a_recorded_decision(
    tiny_recipe, tmp_path: Path, on_collapse: str
) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(
        optimizer={"lr": 1.0e30},
        trainer={"steps": 6, "checkpoint_every": 1, "on_collapse": on_collapse},
    )
    out = tmp_path / "run"
    result = invoke_cli("train", str(recipe), "--out", str(out))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "stopped at step" in result.stderr
    actions = [e["action"] for e in _events(out)]
    assert actions == (["stop"] if on_collapse == "stop" else ["rollback", "rollback", "stop"])
    assert "events" in json.loads((out / "summary.json").read_text())
    for folder in (out / "checkpoints").glob("step_*"):
        assert _all_finite(folder), folder


def test_a_non_finite_update_is_not_applied() -> None:
    model, _ = create_builtin("tiny-dense", seed=0)
    engine = TorchEngine(model, Recipe(), LOCAL)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 90, (2, 8))
    (model(input_ids=ids, labels=ids).loss * float("nan")).backward()
    norm, applied = engine.step()
    assert not applied and norm != norm  # NaN
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert not engine.optimizer.state  # no moment was touched


def test_non_finite_weights_are_never_checkpointed(tmp_path: Path) -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    engine = TorchEngine(model, Recipe(), LOCAL)
    save_checkpoint(tmp_path, 1, engine, tokenizer, {"sampler": {}}, keep=2)
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    with pytest.raises(GspoError, match=r"not finite.*last good one is .*step_000001"):
        save_checkpoint(tmp_path, 2, engine, tokenizer, {"sampler": {}}, keep=2)
    assert (tmp_path / "latest").read_text() == "step_000001"
