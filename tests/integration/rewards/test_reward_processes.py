"""What a user's reward starts (here a `sleep` with a marker argument) ends with its worker:
after the reward's timeout, at the run's normal end, and when the trainer is SIGKILLed (the
`sleep` would otherwise be re-parented to init and live on). Waits are bounded, not timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.helpers import (
    kill_marked,
    marked,
    run_cli,
    survivors_of_sigkill,
    wait_gone,
    write_recipe,
)

# argv[1] of `sleep`: unique to each test, so that other runs' sleeps are never counted
REWARD = """
import subprocess, time

def spawn(completions, **kwargs):
    # its own output: a left-behind sleep holding gspo's pipes would also hang the test's run
    subprocess.Popen(["sleep", "{marker}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep({sleep_s})
    return [float(len(c) % 2) for c in completions]
"""


def _recipe(folder: Path, marker: str, sleep_s: float, timeout_s: float, steps: int) -> Path:
    (folder / "spawning_reward.py").write_text(REWARD.format(marker=marker, sleep_s=sleep_s))
    return write_recipe(
        folder,
        {
            "model": {"path": "builtin:tiny-dense"},
            "trainer": {"steps": steps},
            "reward": {"functions": [{"name": "spawning_reward:spawn"}], "timeout_s": timeout_s},
        },
    )


def _gone(marker: str) -> list[int]:
    """The marked processes still alive after up to 30 s."""
    return wait_gone(marked(marker), timeout=30)


@pytest.mark.slow
def test_what_a_reward_started_ends_with_it_after_its_timeout(tmp_path: Path) -> None:
    marker = "987651"
    recipe = _recipe(tmp_path, marker, sleep_s=1000, timeout_s=0.05, steps=1)
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"), cwd=tmp_path)
    try:
        assert result.returncode == 2, result.stderr[-2000:]
        assert "no result within" in result.stderr
        assert _gone(marker) == []
    finally:
        kill_marked(marker)


@pytest.mark.slow
def test_what_a_reward_started_ends_with_the_run(tmp_path: Path) -> None:
    marker = "987652"
    recipe = _recipe(tmp_path, marker, sleep_s=0, timeout_s=5, steps=2)
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"), cwd=tmp_path)
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        assert _gone(marker) == []
    finally:
        kill_marked(marker)


@pytest.mark.slow
def test_what_a_reward_started_ends_when_the_trainer_is_sigkilled(tmp_path: Path) -> None:
    marker = "987653"
    recipe = _recipe(tmp_path, marker, sleep_s=1000, timeout_s=100, steps=1)
    train = [sys.executable, "-m", "gspo_cli.cli", "train", str(recipe)]
    assert survivors_of_sigkill([*train, "--out", str(tmp_path / "r")], marker, tmp_path) == []
