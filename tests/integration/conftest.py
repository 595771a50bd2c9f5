"""A tiny cold-started checkpoint shared by the training tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gspo_cli.recipe import load_recipe
from gspo_cli.runs.folder import COLD_START
from gspo_cli.train.run.loop import run_sft_only
from tests.helpers import TrainedRuns, write_recipe


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sft")
    recipe_file = write_recipe(
        folder, {"cold_start": {"enabled": True, "steps": 200, "lr": 3e-3, "batch_size": 16}}
    )
    recipe = load_recipe(recipe_file)
    run_sft_only(recipe, recipe_file.read_text(), run_dir=folder / "run")
    return folder / "run" / COLD_START


@pytest.fixture
def tiny_recipe(tmp_path: Path, sft_checkpoint: Path):  # type: ignore[no-untyped-def]
    def make(**overrides: object) -> Path:
        base = {
            "model": {"path": str(sft_checkpoint)},
            "trainer": {"out_dir": str(tmp_path / "runs")},
        }
        from gspo_cli.recipe import deep_merge

        return write_recipe(tmp_path, deep_merge(base, overrides))

    return make


@pytest.fixture(scope="session")
def moe_recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny task on builtin:tiny-moe after a short cold start (boxed answers: rewards vary,
    every step has a gradient), 3 steps of 2 minibatches, one seed per prompt, a learning rate
    that moves experts, a checkpoint at step 2."""
    folder = tmp_path_factory.mktemp("moe")
    (folder / "sft").mkdir()
    boxed = {"arithmetic": {"unboxed_rate": 0.0}}
    sft = write_recipe(
        folder / "sft",
        {
            "model": {"path": "builtin:tiny-moe"},
            "cold_start": {"enabled": True, "steps": 300, "lr": 3e-3, "batch_size": 16},
            "data": boxed,
        },
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same checkpoint whatever the machine's cores
    try:
        run_sft_only(load_recipe(sft), sft.read_text(), run_dir=folder / "sft" / "run")
    finally:
        torch.set_num_threads(threads)
    return write_recipe(
        folder,
        {
            "model": {"path": str(folder / "sft" / "run" / COLD_START)},
            "trainer": {"steps": 3, "checkpoint_every": 2, "out_dir": str(folder / "runs")},
            "algorithm": {"minibatches": 2},
            "rollout": {"seed_per_prompt": True},
            "optimizer": {"lr": 1e-3},
            "data": boxed,
        },
    )


@pytest.fixture(scope="session")
def moe_runs(moe_recipe: Path) -> TrainedRuns:
    """Runs of `moe_recipe` by their options, each trained once for the whole session."""
    return TrainedRuns(moe_recipe, moe_recipe.parent / "runs")
