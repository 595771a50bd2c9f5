"""A tiny cold-started checkpoint shared by the training tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_cli.recipe import load_recipe
from gspo_cli.run_folder import COLD_START
from gspo_cli.train.run.loop import run_sft_only
from tests.helpers import write_recipe


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
