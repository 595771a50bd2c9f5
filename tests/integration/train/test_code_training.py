"""The code reward plugs into `gspo train` through the reward registry."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gspo_cli.data import load_rows
from gspo_cli.recipe import load_recipe
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.train.step.rewards import WeightedRewards
from tests.support.helpers import REPO, TSHIRTS, run_cli

# The container stage of CI runs these too: a short training run with the sandboxed code reward.
pytestmark = pytest.mark.container

RECIPE = REPO / "recipes" / "code" / "codeforces-tiny.yaml"


def test_the_recipes_reward_scores_code_problems_from_the_training_data(shared: Path) -> None:
    recipe = load_recipe(RECIPE)
    rows = {r["id"]: r for r in load_rows(recipe.data.source, "train", recipe.data)}
    row = rows["codeforces/1000_A"]
    good = f"Here it is.\n```python\n{TSHIRTS}```"
    bad = "```python\nprint(0)\n```"
    reward = WeightedRewards(recipe.reward, RewardServices())
    rewards, correct, _ = reward([good, bad, "no code"], [row, row, row])[:3]
    assert rewards == [1.0, 0.0, 0.0] and correct == [1.0, 0.0, 0.0]


@pytest.mark.slow
def test_smoke_code_recipe_runs_one_training_step(shared: Path, tmp_path: Path) -> None:
    """Smoke test of the code pipeline, not of learning: the tiny model cannot write code.

    Checks only that `gspo train` on the code recipe loads its data, scores the rollouts with
    the code reward (no program, so reward 0) and logs one step of finite metrics.
    """
    out = tmp_path / "run"
    result = run_cli("train", str(RECIPE), "--out", str(out), "--set", "trainer.steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and all(
        math.isfinite(v) for v in record.values() if isinstance(v, float)
    )
    assert record["reward_mean"] == 0.0  # the tiny model cannot write a program: honest zero
