"""The tiny cold-started checkpoints the training tests share, each trained once per test run
(tests/support/helpers.py: `cold_start`, keyed by the recipe's digest, shared by xdist workers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import TrainedRuns, cold_start, shared_once, shared_root, write_recipe

TINY_COLD_START = {"cold_start": {"enabled": True, "steps": 200, "lr": 3e-3, "batch_size": 16}}


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cold_start(shared_root(tmp_path_factory), TINY_COLD_START)


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
    root = shared_root(tmp_path_factory)
    boxed = {"arithmetic": {"unboxed_rate": 0.0}}
    checkpoint = cold_start(
        root,
        {
            "model": {"path": "builtin:tiny-moe"},
            "cold_start": {"enabled": True, "steps": 300, "lr": 3e-3, "batch_size": 16},
            "data": boxed,
        },
    )

    def write(folder: Path) -> None:
        folder.mkdir()
        write_recipe(
            folder,
            {
                "model": {"path": str(checkpoint)},
                "trainer": {"steps": 3, "checkpoint_every": 2, "out_dir": str(folder / "runs")},
                "algorithm": {"minibatches": 2},
                "rollout": {"seed_per_prompt": True},
                "optimizer": {"lr": 1e-3},
                "data": boxed,
            },
        )

    return shared_once(root, "moe-recipe", write) / "recipe.yaml"


@pytest.fixture(scope="session")
def moe_runs(moe_recipe: Path) -> TrainedRuns:
    """Runs of `moe_recipe` by their options, each trained once per test run."""
    return TrainedRuns(moe_recipe, moe_recipe.parent / "runs")
