"""The tiny Qwen3-MoE under DeepSpeed on CPU (gloo): two processes at ZeRO 0, 2 and 3 reproduce
one process (losses, gradient norms, ratios, expert volatility), with GSPO at each stage and
with GRPO plus Routing Replay R2 (ZeRO 0) and R3 (ZeRO 3); a two-process ZeRO-3 run
killed with SIGKILL resumes exactly.

Tolerances (support/helpers.py assert_same_moe_runs): losses, gradient norms and ratios to 1e-4
relative (gloo's all-reduce sums in another order than one process does); expert volatility to
1e-6 absolute: it counts top-k experts that changed on the same probe tokens (step/replay.py),
a discrete figure that the float-level differences of the ranks' sums have not flipped here.
The runs are the session's `moe_runs` (tests/integration/conftest.py), shared with
test_expert_parallel.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import (
    TrainedRuns,
    assert_same_moe_runs,
    first_forward_gaps,
    run_cli,
)

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

DEEPSPEED = ("--set", "trainer.engine=deepspeed", "--nproc", "2")
GRPO_R2 = ("--set", "algorithm.name=grpo", "--set", "algorithm.routing_replay=old_policy")
GRPO_R3 = ("--set", "algorithm.name=grpo", "--set", "algorithm.routing_replay=rollout")


def zero(stage: int) -> tuple[str, ...]:
    return ("--set", f"deepspeed.zero_stage={stage}")


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_gspo_two_processes_reproduce_one_process(moe_runs: TrainedRuns, stage: int) -> None:
    assert_same_moe_runs(moe_runs(), moe_runs(*DEEPSPEED, *zero(stage)))


# R2 on the unpartitioned model; R3 where it is hardest (ZeRO-3, its run shared with the resume
# test below). ZeRO-2 and ZeRO-3 alone are the GSPO test's above.
@pytest.mark.parametrize(("replay", "stage"), [(GRPO_R2, 0), (GRPO_R3, 3)], ids=["R2-0", "R3-3"])
def test_grpo_routing_replay_two_processes_reproduce_one_process(
    moe_runs: TrainedRuns, replay: tuple[str, ...], stage: int
) -> None:
    two = moe_runs(*replay, *DEEPSPEED, *zero(stage))
    assert_same_moe_runs(moe_runs(*replay), two)
    # replay holds every training forward to the recorded experts: the first forward is pi_old
    assert all(gap < 1e-5 for gap in first_forward_gaps(two))


def test_zero3_r3_resumes_exactly_after_kill(
    moe_recipe: Path, moe_runs: TrainedRuns, tmp_path: Path
) -> None:
    moe_runs.assert_resume_is_exact(tmp_path / "killed", *GRPO_R3, *DEEPSPEED, *zero(3))


def test_a_changed_recipe_is_refused_before_the_ranks_start(
    moe_recipe: Path, moe_runs: TrainedRuns
) -> None:
    """`--resume --nproc 2` with a setting the checkpoint was made with changed: one line from
    the launching process, exit 2, no rank started (none to leave waiting at a barrier)."""
    run = moe_runs.folder(*DEEPSPEED, *zero(2))
    result = run_cli(
        "train", str(moe_recipe), "--out", str(run), *DEEPSPEED, *zero(2), "--resume",
        "--set", "algorithm.clip_high=0.5",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: --resume: algorithm.clip_high differ from" in result.stderr
    assert "Traceback" not in result.stderr and "deepspeed" not in result.stdout.lower()
