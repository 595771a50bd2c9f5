"""The house stays in order: no import circles, no upward arrows, no file over 500 lines, no
unexplained function over 80 (scripts/house.py), and README's code layout names every module."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _house():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("house", REPO / "scripts" / "house.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["house"] = module
    spec.loader.exec_module(module)
    return module


def test_the_survey_finds_nothing() -> None:
    assert _house().survey() == []


def test_the_survey_sees_a_circle_and_an_upward_arrow(tmp_path: Path) -> None:
    house = _house()
    assert house.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert house.layer_of("gspo_cli.cli") < house.layer_of("gspo_cli.train.step")
    assert house.layer_of("gspo_cli.train.step") < house.layer_of("gspo_cli.recipe.schema")
    assert house.layer_of("gspo_cli.recipe.schema") < house.layer_of("gspo_cli.data.sources")
    assert house.layer_of("gspo_cli.data.sources") < house.layer_of("gspo_cli.algorithms.kl")
    assert house.layer_of("gspo_cli.algorithms.kl") < house.layer_of("gspo_cli.run_folder")


def _layout() -> dict[str, str]:
    """README's code-layout section: each bullet's text by its first backticked name."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Code layout\n", 1)[1].split("\n## ", 1)[0]
    bullets: dict[str, str] = {}
    for bullet in re.split(r"\n(?=- `)", section):
        match = re.match(r"- `([^`]+)`", bullet)
        if match:
            bullets[match.group(1)] = bullet
    return bullets


def test_the_readme_layout_names_every_module() -> None:
    bullets = _layout()
    unnamed = []
    for path in sorted((REPO / "gspo_cli").rglob("*.py")):
        relative = path.relative_to(REPO / "gspo_cli")
        if path.name == "__init__.py":
            continue
        if len(relative.parts) == 1:  # a top-level module: named in any bullet
            named = any(f"`{path.name}`" in bullet for bullet in bullets.values())
        else:  # in its package's bullet
            named = path.name in bullets.get(f"{relative.parts[0]}/", "")
        if not named:
            unnamed.append(str(relative))
    assert not unnamed, f"README's code layout does not name: {', '.join(unnamed)}"
