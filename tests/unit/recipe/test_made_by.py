"""A shipped recipe whose teacher is another run's output names, when that run is missing, the
command its own comments give for making it (recipe/made_by.py, train/run/teacher.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gspo_cli.recipe.loader import load_recipe
from gspo_cli.recipe.made_by import made_by
from gspo_cli.train.run.teacher import missing_teacher
from tests.support.helpers import REPO

DISTILL = sorted((REPO / "recipes" / "distill").glob("*.yaml"))


@pytest.mark.parametrize("recipe", DISTILL, ids=[p.stem for p in DISTILL])
def test_a_missing_teacher_names_the_command_that_makes_it(recipe: Path) -> None:
    resolved = load_recipe(recipe, [])
    assert resolved.algorithm.distill is not None
    teacher = Path(resolved.algorithm.distill.teacher)
    if teacher.exists():
        pytest.skip(f"{teacher} was made on this machine")  # the line is for a fresh clone
    line = missing_teacher(resolved, recipe)
    assert line is not None and "no such folder" in line and "\n" not in line
    command = shlex.split(line.partition("make it first: ")[2])
    assert command[0] == "gspo" and command[1] in ("train", "sft")
    assert (REPO / command[2]).is_file()  # the recipe the command trains
    out = (REPO / command[command.index("--out") + 1]).resolve()
    assert teacher == out or out in teacher.parents


def test_a_command_is_found_across_lines_and_bases_and_only_for_its_folder(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "# make the teacher:\n#   gspo train a.yaml --set x=1 \\\n#     --out runs/t\nname: b\n"
    )
    (tmp_path / "child.yaml").write_text("# gspo train other.yaml --out runs/u\nbase: base.yaml\n")
    found = made_by(tmp_path / "child.yaml", tmp_path / "runs" / "t" / "checkpoints" / "step_1")
    assert found == "gspo train a.yaml --set x=1 --out runs/t"
    assert made_by(tmp_path / "child.yaml", tmp_path / "runs" / "tt") is None
