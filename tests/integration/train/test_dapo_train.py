"""`gspo train` with DAPO's options: metrics, the rounds' lines and their limit, exact resume, and
two processes equal to one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.helpers import gspo_train, run_cli

DAPO = {
    "rollout": {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 3},
    "reward": {"overlong_buffer": 8},  # max_new_tokens 24: responses past 16 tokens pay
    "algorithm": {"mask_truncated": True},
}
# Figures that depend on the clock or the machine, not on the run's arithmetic.
UNTIMED = ("time_", "tokens_per_s", "peak_memory_mb", "mfu_", "peak_flops")


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _train(recipe: Path, out: Path, *extra: str) -> str:
    result = gspo_train(recipe, "--out", str(out), *extra)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.mark.slow
def test_the_options_show_in_a_short_runs_metrics(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(trainer={"steps": 2}, **DAPO)
    _train(recipe, tmp_path / "run")
    for record in _metrics(tmp_path / "run").values():
        for key in (
            "dynamic_sampling_rounds",
            "dynamic_sampling_kept_groups",
            "dynamic_sampling_refill_frac",
            "dynamic_sampling_short",
            "overlong_penalty_mean",
            "overlong_penalised_frac",
            "truncated_masked_frac",
        ):
            assert key in record, key
        assert 1 <= record["dynamic_sampling_rounds"] <= 3
        assert record["overlong_penalty_mean"] <= 0


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async-worker"])
def test_rounds_that_never_fill_the_batch_end_the_run_naming_the_limit(
    tiny_recipe, tmp_path: Path, staleness: int
) -> None:  # type: ignore[no-untyped-def]
    # weight 0: every reward is 0, no group is ever mixed; once nothing was kept in 3 rounds
    # the run ends (it used to train on nothing, every step, in silence); the asynchronous
    # worker's rounds print the same lines
    recipe = tiny_recipe(
        trainer={"steps": 2},
        rollout={
            "dynamic_sampling": True,
            "dynamic_sampling_max_rounds": 3,
            "max_staleness": staleness,
        },
        reward={"functions": [{"name": "math", "weight": 0}]},
    )
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"))
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1, errors
    assert "no group with mixed rewards in 3 rounds" in errors[0]
    assert "rollout.dynamic_sampling_max_rounds" in errors[0]
    assert "step 1: dynamic sampling: round 2/3, 0/4 groups" in result.stdout
    assert "step 1: dynamic sampling: round 3/3, 0/4 groups" in result.stdout
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not _metrics(tmp_path / "run")


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], steps: range) -> None:
    for step in steps:
        assert sorted(a[step]) == sorted(b[step]), step
        for key in (k for k in a[step] if not k.startswith(UNTIMED)):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(trainer={"steps": 4, "checkpoint_every": 2}, **DAPO)
    straight = tmp_path / "straight"
    _train(recipe, straight)
    a = _metrics(straight)
    assert any(a[s]["dynamic_sampling_rounds"] > 1 for s in a), "no refill: the test is vacuous"
    resumed = tmp_path / "resumed"  # as if stopped right after the checkpoint of step 2
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000004")
    (resumed / "checkpoints" / "latest").write_text("step_000002\n")
    _train(recipe, resumed, "--resume")
    b = _metrics(resumed)
    assert sorted(b) == [1, 2, 3, 4]
    _same(a, b, range(3, 5))
    samples = [(resumed / "samples.jsonl"), (straight / "samples.jsonl")]
    later = [[x for x in p.read_text().splitlines() if json.loads(x)["step"] > 2] for p in samples]
    assert later[0] == later[1]


@pytest.mark.slow
def test_two_processes_train_what_one_does(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("deepspeed")
    recipe = tiny_recipe(
        trainer={"steps": 3},
        algorithm={"minibatches": 2, "mask_truncated": True},
        rollout={"seed_per_prompt": True, "dynamic_sampling": True},
        reward={"overlong_buffer": 8},
    )
    _train(recipe, tmp_path / "one")
    two = ("--set", "trainer.engine=deepspeed", "--set", "deepspeed.zero_stage=2", "--nproc", "2")
    _train(recipe, tmp_path / "two", *two)
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert any(a[s]["dynamic_sampling_rounds"] > 1 for s in a), "no refill: the test is vacuous"
    for step in a:
        for key in (
            "loss", "grad_norm", "reward_mean", "seq_ratio_mean", "clip_frac", "response_len_mean",
            "dynamic_sampling_rounds", "dynamic_sampling_kept_groups", "overlong_penalty_mean",
            "truncated_masked_frac",
        ):  # fmt: skip
            if key in a[step] or key in b[step]:
                assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)
