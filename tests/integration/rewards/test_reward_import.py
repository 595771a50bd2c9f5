"""A reward module that exits, hangs or crashes when imported: one line naming it and exit 2,
from `gspo validate` and `gspo train` (it is imported in a child process first), never exit 0
in silence or a hang."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gspo_cli.core.import_probe import IMPORT_TIMEOUT_ENV
from tests.support.helpers import run_cli, write_recipe

SCORE = "\ndef score(completions, **kwargs):\n    return [0.0] * len(completions)\n"
BODIES = {
    "sys_exit": "import sys\nsys.exit(0)\n",
    "os_exit": "import os\nos._exit(0)\n",
    "raises": "raise RuntimeError('no config file here')\n",
    "loops": "while True:\n    pass\n",
}
SAYS = {
    "sys_exit": "called sys.exit(0)",
    "os_exit": "ended its process (exit code 0",
    "raises": "no config file here",
    "loops": "did not finish within 2 s",
}


def _recipe(folder: Path, module: str) -> Path:
    (folder / f"{module}.py").write_text(BODIES[module.removeprefix("bad_")] + SCORE)
    return write_recipe(
        folder,
        {
            "model": {"path": "builtin:tiny-dense"},
            "trainer": {"steps": 1},
            "reward": {"functions": [{"name": f"{module}:score"}]},
        },
    )


def _one_line_naming(result: subprocess.CompletedProcess[str], module: str, says: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"'{module}'" in lines[0] and says in lines[0], lines[0]


@pytest.mark.parametrize("kind", list(BODIES))
def test_validate_names_a_reward_module_that_exits_hangs_or_crashes_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv(IMPORT_TIMEOUT_ENV, "2")  # the hang is found in 2 s, not 60
    module = f"bad_{kind}"
    recipe = _recipe(tmp_path, module)
    result = run_cli("validate", str(recipe), cwd=tmp_path, timeout=120)
    _one_line_naming(result, module, SAYS[kind])


def test_train_names_a_reward_module_that_exits_at_import(tmp_path: Path) -> None:
    module = "bad_os_exit"
    recipe = _recipe(tmp_path, module)
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"), cwd=tmp_path)
    _one_line_naming(result, module, SAYS["os_exit"])
    assert not (tmp_path / "run").exists()  # no run folder: it failed before starting one


def test_a_reward_module_that_imports_fine_is_not_refused(tmp_path: Path) -> None:
    (tmp_path / "good_reward.py").write_text("print('imported')\n" + SCORE)
    recipe = write_recipe(
        tmp_path,
        {
            "model": {"path": "builtin:tiny-dense"},
            "reward": {"functions": [{"name": "good_reward:score"}]},
        },
    )
    result = run_cli("validate", str(recipe), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
