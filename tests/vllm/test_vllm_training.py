"""A short quickstart with `rollout.engine: vllm` learns (held-out accuracy rises).

On the quickstart's round-3 task (half the cold start unboxed, no slips), where 30 steps move
held-out accuracy far beyond the evaluation's noise: what is tested is that vLLM rollouts
train, not what the task teaches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.support.helpers import REPO, invoke_cli

FORM_TASK = ("--set", "data.arithmetic.unboxed_rate=0.5", "--set", "data.arithmetic.slip_rate=0")


def test_a_short_quickstart_with_vllm_rollouts_learns(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = invoke_cli(
        "train",
        str(REPO / "recipes" / "quickstart.yaml"),
        "--out",
        str(out),
        "--set",
        "rollout.engine=vllm",
        *FORM_TASK,
        "--set",
        "trainer.steps=30",
        "--set",
        "eval.every=30",
        "--set",
        "eval.num_problems=100",
        "--set",
        "logging.console=plain",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    heldout = json.loads((out / "summary.json").read_text())["heldout_accuracy"]
    before, after = heldout["0"], heldout["30"]
    assert after >= before + 0.05, heldout  # measured here: 27.0% -> 44.5%
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["mismatch_token_abs_mean"] < 1e-4  # fp32 engine and trainer agree


def test_a_short_quickstart_with_async_vllm_rollouts_learns(tmp_path: Path) -> None:
    """vLLM in the rollout worker, one step behind the trainer, synced after every step."""
    out = tmp_path / "run"
    result = invoke_cli(
        "train",
        str(REPO / "recipes" / "quickstart.yaml"),
        "--out",
        str(out),
        *("--set", "rollout.engine=vllm"),
        *("--set", "rollout.max_staleness=1"),
        *FORM_TASK,
        *("--set", "trainer.steps=30"),
        *("--set", "eval.every=30"),
        *("--set", "eval.num_problems=100"),
        *("--set", "logging.console=plain"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    heldout = json.loads((out / "summary.json").read_text())["heldout_accuracy"]
    assert heldout["30"] >= heldout["0"] + 0.05, heldout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout_staleness"] for m in metrics] == [0] + [1] * 29
    # step 1 trains the policy that sampled it: its first ratio is the engine-trainer gap alone
    assert metrics[0]["first_ratio_gap_max"] < 1e-4
