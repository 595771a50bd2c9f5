"""A user's reward through `gspo train`: found in the working folder, its mean per step in
metrics.jsonl, and a broken call ending the run with one line before the step is applied, so
that `--resume` carries on once the reward is fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo_cli.recipe import deep_merge
from gspo_cli.runs.folder import CHECKPOINTS, METRICS, step_folder
from tests.support.helpers import invoke_cli, write_recipe

REWARDS = '''
from pathlib import Path


def flaky(completions, answer, **kwargs):
    """Scores by length parity; once `armed` is found, the next call breaks its contract."""
    if Path("armed").exists():
        Path("armed").unlink()
        Path("broken").touch()
    elif Path("broken").exists():
        return [1.0] * (len(completions) - 1)
    return [float(len(c) % 2) for c in completions]
'''


def _steps(run: Path) -> list[int]:
    lines = (run / METRICS).read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["step"] for line in lines]


def test_a_broken_reward_stops_before_its_step_and_resume_carries_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)  # importable from here, with no PYTHONPATH
    overrides = {
        "model": {"path": "builtin:tiny-dense"},
        "trainer": {"steps": 2, "checkpoint_every": 1},
        "reward": {"functions": [{"name": "cli_rewards:flaky"}]},
    }
    recipe, run = write_recipe(tmp_path, deep_merge({}, overrides)), tmp_path / "run"
    (tmp_path / "armed").touch()

    result = invoke_cli("train", str(recipe), "--out", str(run))
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: reward 'cli_rewards:flaky': returned 15 scores for 16 completions"
    ]
    assert _steps(run) == [1]  # step 2 was never applied, logged or saved
    assert sorted(p.name for p in (run / CHECKPOINTS).glob("step_*")) == [step_folder(1)]
    record = json.loads((run / METRICS).read_text(encoding="utf-8"))
    assert record["reward/flaky/mean"] == record["reward_mean"]

    (tmp_path / "broken").unlink()  # the user fixes the reward
    result = invoke_cli("train", str(recipe), "--out", str(run), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _steps(run) == [1, 2]
