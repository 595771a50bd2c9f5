"""No silent waits on a reward: a call still running prints a line every HEARTBEAT_S naming the
function and its limits, and the summary says once what reward.timeout_s (per completion)
makes for a step."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_cli.recipe.reward import RewardConfig
from gspo_cli.rewards import worker
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.train.step.rewards import WeightedRewards
from tests.support.helpers import invoke_cli, write_recipe

SLOW = """
import time

def slow_check(completions, **kwargs):
    time.sleep(1.0)
    return [1.0] * len(completions)
"""


def test_a_reward_that_runs_long_says_so_naming_its_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "slow_reward.py").write_text(SLOW)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(worker, "HEARTBEAT_S", 0.3)  # 30 s in a run
    cfg = RewardConfig.model_validate(
        {"functions": [{"name": "slow_reward:slow_check"}], "timeout_s": 20}
    )
    model = WeightedRewards(cfg, RewardServices())
    try:
        scores = model(["a", "b"], [{}, {}])
    finally:
        model.close()
    assert scores.totals == [1.0, 1.0]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) >= 2, lines  # about one per 0.3 s of a 1 s call
    assert lines[0].startswith("reward slow_check: still running after "), lines[0]
    assert lines[0].endswith("(limit 20 s per completion, 40 s for this call's 2 completions)")


def test_the_summary_says_what_the_per_completion_limit_makes_for_a_step(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, {"model": {"path": "builtin:tiny-dense"}})
    result = invoke_cli("validate", str(recipe), "--set", "reward.timeout_s=2.5")
    assert result.returncode == 0, result.stderr
    assert "reward limit 2.5 s per completion (40 s for a step's 16)" in result.stdout
