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


def test_the_survey_finds_nothing_in_the_package() -> None:
    house = _house()
    assert sum(len(targets) for targets in house.import_graph().values()) > 300  # it reads imports
    assert house.survey() == []


def _plant(root: Path, files: dict[str, str]) -> Path:
    package = root / "gspo_cli"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_the_survey_finds_a_circle_an_upward_arrow_and_long_code(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(85))
    package = _plant(
        tmp_path,
        {
            "data/__init__.py": "",
            "data/rows.py": "from gspo_cli.train import step\n",  # data -> train: upward
            "train/__init__.py": "",
            "train/step.py": "from gspo_cli.train.loop import run\n",
            "train/loop.py": "def run() -> None:\n    from gspo_cli.train import step\n",
            "train/long.py": f"def long() -> None:\n{body}",
            "train/kept.py": f"def kept() -> None:\n    # long on purpose: a test\n{body}",
            "train/big.py": "x = 1\n" * 501,
        },
    )
    findings = _house().survey(package)
    assert "upward arrow: gspo_cli.data.rows -> gspo_cli.train.step" in findings
    assert "import circle: gspo_cli.train.loop <-> gspo_cli.train.step" in findings
    assert any(f.startswith("long function: gspo_cli/train/long.py") for f in findings)
    assert not any("kept.py" in f for f in findings)
    assert "long file: gspo_cli/train/big.py has 501 lines" in findings
    assert len(findings) == 4, findings


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


def _named(text: str) -> set[str]:
    """The module file names a bullet names in backticks (`step.py`, `forward/`'s `batch.py`)."""
    return {name.rsplit("/", 1)[-1] for name in re.findall(r"`([\w/]+\.py)`", text)}


def test_the_readme_layout_names_every_module_and_no_other() -> None:
    bullets = _layout()
    top_level = set().union(*(_named(b) for key, b in bullets.items() if not key.endswith("/")))
    unnamed, stale = [], []
    for key, bullet in bullets.items():
        if key.endswith("/"):  # a package's bullet names its own modules, nested ones included
            modules = {p.name for p in (REPO / "gspo_cli" / key).rglob("*.py")}
            stale += [f"{key}{name}" for name in _named(bullet) - modules]
    for path in sorted((REPO / "gspo_cli").rglob("*.py")):
        relative = path.relative_to(REPO / "gspo_cli")
        if path.name == "__init__.py":
            continue
        if len(relative.parts) == 1:
            named = path.name in top_level
        else:
            named = path.name in _named(bullets.get(f"{relative.parts[0]}/", ""))
        if not named:
            unnamed.append(str(relative))
    assert not unnamed, f"README's code layout does not name: {', '.join(unnamed)}"
    assert not stale, f"README's code layout names modules that do not exist: {', '.join(stale)}"
