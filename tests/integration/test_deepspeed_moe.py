"""The tiny Qwen3-MoE under DeepSpeed on CPU (gloo): two processes at ZeRO 0, 2 and 3 reproduce
one process (losses, gradient norms, ratios, expert volatility), with GSPO and with GRPO plus
Routing Replay R2 and R3; a two-process ZeRO-3 run killed with SIGKILL resumes exactly.

Tolerances: losses, gradient norms and ratios to 1e-4 relative (gloo's all-reduce sums in
another order than one process does); expert volatility to 1e-6 absolute: it counts top-k
experts that changed on the same probe tokens (step/replay.py), a discrete figure that the
float-level differences of the ranks' sums have not flipped here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gspo_cli.recipe import load_recipe
from gspo_cli.run_folder import COLD_START
from gspo_cli.train.run.loop import run_sft_only
from tests.helpers import kill_during_run, run_cli, run_metrics, write_recipe

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

STEPS = 3
COMPARED = (
    "loss",
    "grad_norm",
    "reward_mean",
    "seq_ratio_mean",
    "token_ratio_mean",
    "clip_frac",
    "response_len_mean",
)
MOE = ("expert_volatility", "expert_volatility_update0", "expert_volatility_update1")
DEEPSPEED = ("--set", "trainer.engine=deepspeed", "--nproc", "2")
GRPO_R2 = ("--set", "algorithm.name=grpo", "--set", "algorithm.routing_replay=old_policy")
GRPO_R3 = ("--set", "algorithm.name=grpo", "--set", "algorithm.routing_replay=rollout")


def zero(stage: int) -> tuple[str, ...]:
    return ("--set", f"deepspeed.zero_stage={stage}")


@pytest.fixture(scope="module")
def moe_recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny task on builtin:tiny-moe after a short cold start (so rewards vary and every
    step has a gradient), 2 minibatches per step, one seed per prompt, a learning rate that
    moves experts."""
    folder = tmp_path_factory.mktemp("moe")
    (folder / "sft").mkdir()
    sft = write_recipe(
        folder / "sft",
        {
            "model": {"path": "builtin:tiny-moe"},
            "cold_start": {"enabled": True, "steps": 300, "lr": 3e-3, "batch_size": 16},
            "data": {"arithmetic": {"unboxed_rate": 0.0}},  # boxed answers: rewards vary
        },
    )
    run_sft_only(load_recipe(sft), sft.read_text(), run_dir=folder / "sft" / "run")
    return write_recipe(
        folder,
        {
            "model": {"path": str(folder / "sft" / "run" / COLD_START)},
            "trainer": {"steps": STEPS, "checkpoint_every": 2, "out_dir": str(folder / "runs")},
            "algorithm": {"minibatches": 2},
            "rollout": {"seed_per_prompt": True},
            "optimizer": {"lr": 1e-3},  # large enough steps to move experts
            "data": {"arithmetic": {"unboxed_rate": 0.0}},
        },
    )


def _train(recipe: Path, out: Path, *extra: str) -> dict[int, dict[str, Any]]:
    result = run_cli("train", str(recipe), "--out", str(out), *extra)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_metrics(out)


def _same(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], steps: range) -> None:
    assert any(a[s]["grad_norm"] > 0 for s in a), "no gradient signal: the test would be vacuous"
    assert all(a[s]["expert_volatility"] > 0 for s in a), "no expert moved: vacuous"
    for step in steps:
        for key in (k for k in COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)
        for key in MOE:
            assert b[step][key] == pytest.approx(a[step][key], abs=1e-6), (step, key)


@pytest.fixture(scope="module")
def runs(moe_recipe: Path) -> Path:
    return moe_recipe.parent / "runs"


@pytest.fixture(scope="module")
def gspo_one(moe_recipe: Path, runs: Path) -> dict[int, dict[str, Any]]:
    return _train(moe_recipe, runs / "gspo-one")


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_gspo_two_processes_reproduce_one_process(
    moe_recipe: Path, runs: Path, gspo_one: dict[int, dict[str, Any]], stage: int
) -> None:
    two = _train(moe_recipe, runs / f"gspo-zero{stage}", *DEEPSPEED, *zero(stage))
    _same(gspo_one, two, range(1, STEPS + 1))


def test_grpo_routing_replay_r2_two_processes_zero2(moe_recipe: Path, runs: Path) -> None:
    one = _train(moe_recipe, runs / "r2-one", *GRPO_R2)
    two = _train(moe_recipe, runs / "r2-zero2", *GRPO_R2, *DEEPSPEED, *zero(2))
    _same(one, two, range(1, STEPS + 1))
    # R2 holds every training forward to pi_old's experts: the first forward is pi_old
    assert all(two[s]["first_ratio_gap_max"] < 1e-5 for s in two)


@pytest.fixture(scope="module")
def r3_zero3(moe_recipe: Path, runs: Path) -> dict[int, dict[str, Any]]:
    return _train(moe_recipe, runs / "r3-zero3", *GRPO_R3, *DEEPSPEED, *zero(3))


def test_grpo_routing_replay_r3_two_processes_zero3(
    moe_recipe: Path, runs: Path, r3_zero3: dict[int, dict[str, Any]]
) -> None:
    one = _train(moe_recipe, runs / "r3-one", *GRPO_R3)
    _same(one, r3_zero3, range(1, STEPS + 1))


def test_zero3_r3_resumes_exactly_after_kill(
    moe_recipe: Path, r3_zero3: dict[int, dict[str, Any]], tmp_path: Path
) -> None:
    killed = tmp_path / "killed"
    command = ["train", str(moe_recipe), "--out", str(killed), *GRPO_R3, *DEEPSPEED, *zero(3)]
    stopped_at = kill_during_run(command, killed)
    assert stopped_at < STEPS, "the run ended before it could be killed"
    resumed = _train(moe_recipe, killed, *GRPO_R3, *DEEPSPEED, *zero(3), "--resume")
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(stopped_at + 1, STEPS + 1):
        for key in (*COMPARED, *MOE):
            if key in r3_zero3[step]:
                assert resumed[step][key] == r3_zero3[step][key], (step, key)  # bit for bit
