"""A run on two environments (recipe `environments`): each step draws them by weight; each
generates with its own budget and temperature (the trainer scores its rows at it) and scores
with its own rewards; metrics and held-out accuracy come per environment with the weighted mean;
the curriculum sets flat prompts aside; a killed run resumes record for record, the curriculum's
state with it; and `gspo eval --recipe` gives the run's own held-out figures."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import (
    first_forward_gaps,
    run_cli,
    run_metrics,
    train_until_checkpoint,
)

pytestmark = pytest.mark.slow

STEPS = 3
ENVIRONMENTS = [
    {"name": "sums", "weight": 3, "temperature": 0.8},  # its rewards vary: its rows train
    {
        "name": "chain",
        "weight": 1,
        "data": {
            "source": "reasoning_gym:chain_sum",
            "reasoning_gym": {
                "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
                "size": 60,
                "eval_size": 8,
            },
        },
        "reward": [{"name": "reasoning_gym"}],
        "max_new_tokens": 12,
        "eval": {"num_problems": 3, "samples": 1},
    },
]


@pytest.fixture(scope="module")
def mixture(tmp_path_factory: pytest.TempPathFactory, sft_checkpoint: Path) -> Path:
    from tests.support.helpers import write_recipe

    folder = tmp_path_factory.mktemp("mixture")
    return write_recipe(
        folder,
        {
            "model": {"path": str(sft_checkpoint)},
            "environments": ENVIRONMENTS,
            "data": {"curriculum": {"enabled": True, "visits": 1, "set_aside_epochs": 1}},
            "trainer": {"steps": STEPS, "checkpoint_every": 1, "out_dir": str(folder / "runs")},
            "eval": {"every": STEPS},
        },
    )


@pytest.fixture(scope="module")
def straight(mixture: Path) -> Path:
    out = mixture.parent / "straight"
    result = run_cli("train", str(mixture), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _records(run: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def test_each_environment_is_drawn_sampled_and_measured_on_its_own(straight: Path) -> None:
    metrics = run_metrics(straight)
    assert sorted(metrics) == [1, 2, 3]
    for step in metrics.values():
        assert step["env/sums/batch_share"] == 0.75 and step["env/chain/batch_share"] == 0.25
        assert step["env/chain/response_len_mean"] <= 12  # its own budget, not the run's 24
        assert "env/chain/reward/reasoning_gym/mean" in step
        assert "env/sums/reward/math/mean" in step and "env/sums/answered" in step
        assert "env/chain/answered" not in step  # its reward does not measure answer forms
    # the trainer scores each row at the temperature it was sampled at: its log-probs are the
    # engine's up to float noise (a row scored at the run's temperature is 2e-2 off), so the
    # engine's log-probs stay pi_old on every step
    gaps = [step["engine_gap_seq_max"] for step in metrics.values()]
    assert max(gaps) < 1e-4 and max(first_forward_gaps(metrics)) < 1e-4, gaps
    assert all(step["pi_old_from_engine"] == 1.0 for step in metrics.values())
    before, after = _records(straight, "eval.jsonl")
    for record in (before, after):
        assert record["env/chain/num_problems"] == 3 and record["env/chain/samples"] == 1
        assert record["env/sums/num_problems"] == 8  # the recipe's eval sizes
        weighted = (3 * record["env/sums/accuracy"] + record["env/chain/accuracy"]) / 4
        assert record["accuracy"] == pytest.approx(weighted)
    set_aside = [step["curriculum_set_aside"] for step in metrics.values()]
    assert set_aside[-1] > 0, "nothing set aside: the resume test would not cover it"
    assert sum(step["curriculum_set_aside_new"] for step in metrics.values()) >= set_aside[-1]


def test_a_killed_mixture_resumes_record_for_record(mixture: Path, straight: Path) -> None:
    killed = mixture.parent / "killed"
    proc = train_until_checkpoint(mixture, killed)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stopped_at = int((killed / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert stopped_at < STEPS, "the run ended before it could be killed"
    result = run_cli("train", str(mixture), "--out", str(killed), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = run_metrics(straight), run_metrics(killed)
    assert sorted(b) == sorted(a)
    for step in range(stopped_at + 1, STEPS + 1):
        compared = ("loss", "reward_mean", "curriculum_set_aside", "curriculum_set_aside_new")
        for key in (k for k in a[step] if k.startswith("env/") or k in compared):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)
    completions = [
        [r["completion"] for r in _records(run, "samples.jsonl") if r["step"] > stopped_at]
        for run in (straight, killed)
    ]
    assert completions[0] and completions[0] == completions[1]


def test_gspo_eval_with_the_recipe_gives_the_runs_own_held_out_figures(
    mixture: Path, straight: Path, tmp_path: Path
) -> None:
    """`gspo eval RUN --recipe R` without a benchmark evaluates each environment as training
    did (same problems, samples, temperature, seed): the run's last held-out record, to the
    digit, in results.json as `gspo compare` reads it."""
    out = tmp_path / "heldout"
    result = run_cli("eval", str(straight), "--recipe", str(mixture), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    last = _records(straight, "eval.jsonl")[-1]
    assert last["env/sums/answered"] > 0, "nothing answered: equal figures would prove little"
    for key in ("accuracy", "env/sums/accuracy", "env/sums/answered", "env/chain/accuracy"):
        assert metrics[key]["value"] == last[key], key
        assert metrics[key]["ci_low"] == last[f"{key}_ci_low"], key
