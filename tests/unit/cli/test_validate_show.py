from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.helpers import REPO, run_cli


def test_validate_prints_a_summary_and_exits_0() -> None:
    result = run_cli("validate", "recipes/quickstart.yaml")
    assert result.returncode == 0, result.stderr
    assert "quickstart: gspo" in result.stdout


def test_show_prints_the_resolved_recipe_with_overrides() -> None:
    result = run_cli("show", "recipes/quickstart-grpo.yaml", "--set", "algorithm.clip_high=0.3")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["name"] == "quickstart-grpo"
    assert resolved["algorithm"]["name"] == "grpo"
    assert resolved["algorithm"]["clip_high"] == 0.3
    assert resolved["algorithm"]["clip_low"] == 0.2
    assert resolved["cold_start"]["enabled"] is True  # inherited from the base recipe


def test_bad_recipe_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm:\n  clip_hgih: 1\nrollout:\n  group_size: 1\n")
    result = run_cli("validate", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert any("algorithm.clip_hgih: unknown key; did you mean 'clip_high'?" in x for x in lines)
    assert any("rollout.group_size" in x for x in lines)


def test_missing_recipe_and_bad_yaml_exit_2(tmp_path: Path) -> None:
    result = run_cli("show", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "file not found" in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nalgorithm: {name: gspo\n")
    result = run_cli("validate", str(broken))
    assert result.returncode == 2 and "invalid YAML" in result.stderr and "line" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_command_is_a_usage_error() -> None:
    result = run_cli("frobnicate")
    assert result.returncode == 2


def test_cli_runs_from_any_folder(tmp_path: Path) -> None:
    result = run_cli("validate", str(REPO / "recipes" / "quickstart.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_bad_recipe_fails_before_the_trainer_is_imported(tmp_path: Path) -> None:
    """`gspo train` checks the recipe first: a typo costs no transformers/trainer import (4.4 s
    -> 1.5 s here; the algorithm registry the names are checked against needs torch)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  group_sise: 4\n")
    code = (
        "import sys\nfrom gspo_cli.cli import main\n"
        f"sys.argv = ['gspo', 'train', {str(bad)!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('transformers' in sys.modules, 'gspo_cli.train.run.loop' in sys.modules, code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False", "2"], result.stdout + result.stderr
