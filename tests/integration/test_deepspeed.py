"""The DeepSpeed engine on CPU (gloo): equal to plain torch, world-size invariant, resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytest.importorskip("deepspeed")

STEPS = 4
COMPARED = ("loss", "grad_norm", "reward_mean", "seq_ratio_mean", "clip_frac", "response_len_mean")


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], steps: range) -> None:
    for step in steps:
        for key in COMPARED:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.fixture
def ds_recipe(tiny_recipe):  # type: ignore[no-untyped-def]
    return tiny_recipe(
        trainer={"steps": STEPS, "checkpoint_every": 2},
        algorithm={"minibatches": 2},
        rollout={"seed_per_prompt": True},
    )


def _train(recipe: Path, out: Path, *extra: str) -> None:
    result = run_cli("train", str(recipe), "--out", str(out), *extra)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_one_process_reproduces_the_plain_torch_engine(ds_recipe: Path, tmp_path: Path) -> None:
    _train(ds_recipe, tmp_path / "torch")
    _train(ds_recipe, tmp_path / "ds", "--set", "trainer.engine=deepspeed")
    a, b = _metrics(tmp_path / "torch"), _metrics(tmp_path / "ds")
    assert any(a[s]["grad_norm"] > 0 for s in a), "no gradient signal: the test would be vacuous"
    _same(a, b, range(1, STEPS + 1))


def test_two_processes_zero2_reproduce_one_process(ds_recipe: Path, tmp_path: Path) -> None:
    ds = ("--set", "trainer.engine=deepspeed", "--set", "deepspeed.zero_stage=2")
    _train(ds_recipe, tmp_path / "one", *ds)
    _train(ds_recipe, tmp_path / "two", *ds, "--nproc", "2")
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    _same(a, b, range(1, STEPS + 1))
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").glob("step_*")) == [
        "step_000002",
        "step_000004",
    ]
    hf = tmp_path / "two" / "checkpoints" / "step_000004"
    assert (hf / "config.json").is_file() and (hf / "model.safetensors").is_file()


def test_resume_after_kill_with_two_processes(ds_recipe: Path, tmp_path: Path) -> None:
    ds = ("--set", "trainer.engine=deepspeed", "--nproc", "2")
    _train(ds_recipe, tmp_path / "straight", *ds)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli.cli", "train", str(ds_recipe), "--out", str(killed), *ds],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the launcher and both ranks share one process group
    )
    latest = killed / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    stopped_at = int(latest.read_text().strip().removeprefix("step_"))
    assert stopped_at < STEPS, "the run ended before it could be killed"
    _train(ds_recipe, killed, *ds, "--resume")
    a, b = _metrics(tmp_path / "straight"), _metrics(killed)
    assert sorted(b) == list(range(1, STEPS + 1))
    _same(a, b, range(stopped_at + 1, STEPS + 1))


def test_resume_at_another_world_size_is_refused_clearly(ds_recipe: Path, tmp_path: Path) -> None:
    _train(ds_recipe, tmp_path / "run", "--set", "trainer.engine=deepspeed", "--nproc", "2")
    result = run_cli(
        "train",
        str(ds_recipe),
        "--out",
        str(tmp_path / "run"),
        "--set",
        "trainer.engine=deepspeed",
        "--set",
        f"trainer.steps={STEPS + 1}",
        "--resume",
    )
    assert result.returncode == 2
    assert "resume with --nproc 2" in result.stderr


def test_nproc_needs_the_deepspeed_engine(ds_recipe: Path, tmp_path: Path) -> None:
    result = run_cli("train", str(ds_recipe), "--out", str(tmp_path / "r"), "--nproc", "2")
    assert result.returncode == 2 and "trainer.engine: deepspeed" in result.stderr


def test_zero0_resumes_at_another_world_size(ds_recipe: Path, tmp_path: Path) -> None:
    zero0 = ("--set", "trainer.engine=deepspeed", "--set", "deepspeed.zero_stage=0")
    _train(ds_recipe, tmp_path / "run", *zero0, "--nproc", "2")
    _train(ds_recipe, tmp_path / "run", *zero0, "--set", f"trainer.steps={STEPS + 1}", "--resume")
    assert sorted(_metrics(tmp_path / "run")) == list(range(1, STEPS + 2))
