"""The training guards end to end on the tiny cold-started model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from gspo_cli.core.errors import GspoError
from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe, dump_recipe_yaml, load_recipe
from gspo_cli.runs.retention import Retention
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.checkpoint import save_checkpoint
from gspo_cli.train.run.loop import run_loop
from gspo_cli.train.run.prepare import prepare_run
from tests.support.helpers import invoke_cli


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
    engine = TorchEngine(model, engine_settings(Recipe()), LOCAL)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 90, (2, 8))
    (model(input_ids=ids, labels=ids).loss * float("nan")).backward()
    norm, applied = engine.step()
    assert not applied and norm != norm  # NaN
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert not engine.optimizer.state  # no moment was touched


def test_non_finite_weights_are_never_checkpointed(tmp_path: Path) -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    engine = TorchEngine(model, engine_settings(Recipe()), LOCAL)
    save_checkpoint(tmp_path, 1, engine, tokenizer, {"sampler": {}}, keep=Retention(2))
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    with pytest.raises(GspoError, match=r"not finite.*last good one is .*step_000001"):
        save_checkpoint(tmp_path, 2, engine, tokenizer, {"sampler": {}}, keep=Retention(2))
    assert (tmp_path / "latest").read_text() == "step_000001"


class _Recording:
    """The rollout engine, keeping each call's prompts, number of samples and completions."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[list[list[int]], int, list[str]]] = []

    def generate(self, prompts: list[list[int]], params: Any, seeds: Any = None, **_: Any) -> Any:
        out = self.inner.generate(prompts, params, seeds)
        self.calls.append((prompts, params.num_samples, list(out.texts)))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("seed_per_prompt", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_lr_1e30_rolls_back_with_fresh_rollouts_and_a_compounded_lower_lr(
    tiny_recipe, tmp_path: Path, seed_per_prompt: bool
) -> None:  # type: ignore[no-untyped-def]
    """The first update wrecks the policy and the next ones are non-finite: whichever guard
    fires, on_collapse: rollback rolls back, each retry samples afresh, and the learning rate
    halves at each rollback (x0.25 after two)."""
    recipe = load_recipe(
        tiny_recipe(
            optimizer={"lr": 1.0e30},
            rollout={
                "num_prompts": 8, "group_size": 8, "max_new_tokens": 32,
                "seed_per_prompt": seed_per_prompt,
            },
            trainer={"steps": 3, "on_collapse": "rollback", "max_rollbacks": 2},
        )
    )  # fmt: skip
    out = tmp_path / "run"
    run = prepare_run(recipe, dump_recipe_yaml(recipe), out, False, Console(quiet=True))
    recorder = _Recording(run.rollout_engine)
    run.step_environments = [replace(run.step_environments[0], rollout=recorder)]
    try:
        with pytest.raises(GspoError, match="stopped at step"):
            run_loop(run)
    finally:
        run.close()
    actions = [e["action"] for e in _events(out)]
    assert actions[0] == "rollback" and actions[-1] == "stop", actions
    steps = [(p, texts) for p, n, texts in recorder.calls if n == recipe.rollout.group_size]
    retries = [texts for prompts, texts in steps if prompts == steps[0][0]]  # the same step
    assert len(retries) == 3  # the first try and two retries, after rolling back to step 0
    assert retries[0] != retries[1] and retries[1] != retries[2]
    assert _metrics_lr(out) == pytest.approx(0.25e30)


def _metrics_lr(run: Path) -> float:
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return float(last["lr"])
