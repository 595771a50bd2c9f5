"""`gspo train` with the KL in the reward, a refreshed reference and the entropy bonus: the run
logs the new metrics, and a resume reproduces the uninterrupted run (reference included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import invoke_cli, run_cli

SETTINGS = {
    "algorithm": {
        "kl_coef": 0.5,
        "kl_in": "reward",
        "kl_estimator": "low_var_kl",
        "ref_update_every": 2,
        "entropy_coef": 0.01,
    },
    "optimizer": {"lr": 1e-4},
    "rollout": {"seed_per_prompt": True},  # sampling independent of the evaluations' RNG use
}


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


def test_kl_in_reward_with_refreshed_reference_logs_and_resumes_exactly(  # type: ignore[no-untyped-def]
    tiny_recipe, tmp_path: Path
) -> None:
    straight = tmp_path / "straight"
    recipe = tiny_recipe(**SETTINGS, trainer={"steps": 4, "checkpoint_every": 3})
    result = invoke_cli("train", str(recipe), "--out", str(straight))
    assert result.returncode == 0, result.stderr[-2000:]
    a = _metrics(straight)
    for key in ("kl_reward_penalty", "kl", "entropy_bonus", "entropy"):
        assert all(key in a[s] for s in a), key
    # pi_old equals the reference at step 1 (the start) and step 3 (refreshed after step 2)
    assert a[1]["kl_reward_penalty"] == pytest.approx(0, abs=1e-9)
    assert a[3]["kl_reward_penalty"] == pytest.approx(0, abs=1e-9)
    assert a[2]["kl_reward_penalty"] > 0 and a[4]["kl_reward_penalty"] > 0
    assert a[4]["entropy_bonus"] == pytest.approx(0.01 * a[4]["entropy"], rel=1e-6)

    # the same run stopped after step 3 (its checkpoint holds the step-2 reference), resumed
    resumed = tmp_path / "resumed"
    first = tiny_recipe(**SETTINGS, trainer={"steps": 3, "checkpoint_every": 3})
    assert invoke_cli("train", str(first), "--out", str(resumed)).returncode == 0
    recipe = tiny_recipe(**SETTINGS, trainer={"steps": 4, "checkpoint_every": 3})  # (one file)
    result = invoke_cli("train", str(recipe), "--out", str(resumed), "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    b = _metrics(resumed)
    assert sorted(b) == [1, 2, 3, 4]
    for key in ("kl_reward_penalty", "kl", "loss", "grad_norm", "entropy", "reward_mean"):
        assert b[4][key] == pytest.approx(a[4][key], rel=1e-5, abs=1e-9), key


@pytest.mark.parametrize(
    "algorithm,expected",
    [
        ("{kl_in: reward}", "algorithm.kl_in reward has no effect with kl_coef 0"),
        ("{kl_coef: 0.1, kl_estimator: k4}", "unknown kl estimator 'k4'; known: k1, k2, k3"),
        ("{kl_coef: 0.1, kl_in: both}", "algorithm.kl_in: Input should be 'loss' or 'reward'"),
        ("{kl_coef: 0.1, ref_update_every: -1}", "ref_update_every: Input should be greater than"),
        ("{ref_update_every: 5}", "algorithm.ref_update_every 5 has no effect with kl_coef 0"),
        ("{entropy_coef: -0.1}", "algorithm.entropy_coef: Input should be greater than"),
    ],
)
def test_bad_kl_and_entropy_settings_give_one_line(
    tmp_path: Path, algorithm: str, expected: str
) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"algorithm: {algorithm}\n")
    result = run_cli("validate", str(recipe))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
