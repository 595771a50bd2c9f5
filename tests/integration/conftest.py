"""A tiny cold-started checkpoint shared by the training tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gspo_cli.recipe import load_recipe
from gspo_cli.run_folder import COLD_START
from gspo_cli.train.loop import run_sft_only

# Small enough to train in seconds, easy enough that a short SFT gives mixed rewards.
TINY_TASK = {
    "data": {
        "arithmetic": {
            "num_train": 100,
            "num_eval": 16,
            "max_operand": 9,
            "min_ops": 1,
            "max_ops": 1,
            "unboxed_rate": 0.5,
        }
    },
    "rollout": {"num_prompts": 4, "group_size": 4, "max_new_tokens": 24},
    "eval": {"num_problems": 8, "samples": 2, "every": 100},
    "reward": {"num_workers": 1},
    "logging": {"console": "plain"},
}


def write_recipe(folder: Path, overrides: dict) -> Path:  # type: ignore[type-arg]
    from gspo_cli.recipe import deep_merge

    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(deep_merge(TINY_TASK, overrides)))
    return path


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sft")
    recipe_file = write_recipe(
        folder, {"cold_start": {"enabled": True, "steps": 200, "lr": 3e-3, "batch_size": 16}}
    )
    recipe = load_recipe(recipe_file)
    run_sft_only(recipe, recipe_file.read_text(), out=folder / "run")
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
