"""The house stays in order: no import circles, no packages importing each other, no upward
arrows (train/'s wings included), no loose module at the top level, rollout/ apart from rewards/
and models/ apart from rollout/, no file over 400 lines, no unexplained function over 60
(scripts/house.py), no test module importing another, and the code layout page,
docs/code-layout.md, names every module."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


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


LAYOUT = REPO / "docs" / "code-layout.md"


def test_the_survey_finds_packages_that_import_each_other_and_a_wing_arrow(tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            # one layer, no module circle, but the two packages import each other
            "rollout/__init__.py": "",
            "rollout/base.py": "from gspo_cli.models.forward import batch\n",
            "models/__init__.py": "",
            "models/forward/__init__.py": "",
            "models/forward/batch.py": "from gspo_cli.rollout.types import Batch\n",
            "rollout/types.py": "Batch = list\n",
            # train/'s wings: step sits below run
            "train/__init__.py": "",
            "train/run/__init__.py": "",
            "train/run/loop.py": "from gspo_cli.train.step import update\n",
            "train/step/__init__.py": "",
            "train/step/update.py": "",
            "train/step/collect.py": "from gspo_cli.train.run.loop import x\n",
        },
    )
    findings = _house().survey(package)
    assert "package circle: gspo_cli.models <-> gspo_cli.rollout" in findings
    assert "upward arrow: gspo_cli.train.step.collect -> gspo_cli.train.run.loop" in findings
    assert "package circle: gspo_cli.train.run <-> gspo_cli.train.step" in findings
    assert "forbidden arrow: gspo_cli.models.forward.batch -> gspo_cli.rollout.types" in findings
    assert not any(f.startswith("import circle") for f in findings), findings
    assert len(findings) == 4, findings


def test_the_survey_finds_a_loose_module_and_arrows_kept_apart(tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            "cli.py": "",
            "errors.py": "",  # a loose module beside the folders
            "rollout/__init__.py": "",
            "rollout/tools.py": "from gspo_cli.rewards.code import judge\n",
            "rewards/__init__.py": "",
            "rewards/code.py": "judge = 1\n",
            "models/__init__.py": "",
            "models/batch.py": "from gspo_cli.rollout import batch\n",
            "rollout/batch.py": "",
        },
    )
    findings = _house().survey(package)
    assert "loose module: gspo_cli/errors.py (top level: folders)" in findings
    assert "forbidden arrow: gspo_cli.rollout.tools -> gspo_cli.rewards.code" in findings
    assert "forbidden arrow: gspo_cli.models.batch -> gspo_cli.rollout.batch" in findings
    assert len(findings) == 3, findings


def _test_module_imports(root: Path) -> list[str]:
    """`file: module` for each import of one test module (`test_*`) by another file of tests/."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for name in names:
                if name.rsplit(".", 1)[-1].startswith("test_"):
                    found.append(f"{path.relative_to(root.parent)}: {name}")
                    break
    return found


def test_the_tests_mirror_the_wings() -> None:
    """tests/unit/<wing>/ and tests/integration/<wing>/ for gspo_cli's wings (cli.py included),
    every wing tested in one of them, no test module loose at their top, and shared helpers in
    tests/support/ (tests/unit/repo/ tests the repository itself: this house, docs, scripts)."""
    wings = {p.name for p in (REPO / "gspo_cli").iterdir() if (p / "__init__.py").is_file()}
    wings.add("cli")
    tested: set[str] = set()
    for kind in ("unit", "integration"):
        root = REPO / "tests" / kind
        assert not list(root.glob("test_*.py")), f"tests/{kind}/ holds folders only"
        folders = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}
        assert folders <= wings | {"repo"}, f"tests/{kind}/ has no wing {folders - wings}"
        tested |= {f for f in folders if list((root / f).glob("test_*.py"))}
    assert wings <= tested, f"wings without tests: {sorted(wings - tested)}"
    assert not list((REPO / "tests" / "support").glob("test_*.py"))


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/support/, never in a test module."""
    assert _test_module_imports(REPO / "tests") == []


def test_a_test_to_test_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    planted = "from tests.integration.train.test_stop_signals import wait\n"
    (tmp_path / "tests" / "integration" / "test_async.py").write_text(planted)
    (tmp_path / "tests" / "helpers.py").write_text("from tests.support.small_models import tiny\n")
    found = _test_module_imports(tmp_path / "tests")
    assert found == ["tests/integration/test_async.py: tests.integration.train.test_stop_signals"]


def _layout() -> dict[str, str]:
    """docs/code-layout.md: each bullet's text by its first backticked name (the package's
    section: the page's later sections, such as the tests', are not bullets of modules)."""
    text = LAYOUT.read_text().split("\n## ")[0]
    bullets: dict[str, str] = {}
    for bullet in re.split(r"\n(?=- `)", text):
        match = re.match(r"- `([^`]+)`", bullet)
        if match:
            bullets[match.group(1)] = bullet
    return bullets


def _named(text: str) -> set[str]:
    """The module file names a bullet names in backticks (`step.py`, `forward/`'s `batch.py`)."""
    return {name.rsplit("/", 1)[-1] for name in re.findall(r"`([\w/]+\.py)`", text)}


def test_the_layout_page_names_every_module_and_no_other() -> None:
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
    assert not unnamed, f"docs/code-layout.md does not name: {', '.join(unnamed)}"
    assert not stale, f"docs/code-layout.md names modules that do not exist: {', '.join(stale)}"
