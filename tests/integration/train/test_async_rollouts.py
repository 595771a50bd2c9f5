"""Asynchronous rollouts (rollout.max_staleness): the staleness bound, exact resume after
SIGKILL, no process outliving the trainer, a dead or hung worker, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import (
    REPO,
    children,
    descendants,
    invoke_cli,
    run_cli,
    train_until_checkpoint,
    wait_gone,
)

ASYNC = {"rollout": {"num_prompts": 4, "group_size": 4, "max_new_tokens": 24}}
COMPARED = ("loss", "reward_mean", "grad_norm", "seq_ratio_mean", "clip_frac", "response_len_mean")


def _records(run: Path, name: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def _by_step(run: Path) -> dict[int, dict[str, float]]:
    return {rec["step"]: rec for rec in _records(run, "metrics.jsonl")}


def _async_recipe(tiny_recipe, staleness: int, **trainer: object) -> Path:  # type: ignore[no-untyped-def]
    return tiny_recipe(  # type: ignore[no-any-return]
        rollout={**ASYNC["rollout"], "max_staleness": staleness},
        trainer={"steps": 5, "checkpoint_every": 2, **trainer},
    )


def _worker_pids(trainer_pid: int) -> list[int]:
    """The trainer's spawned children (the rollout worker), by their spawn command line."""
    found = []
    for pid in children(trainer_pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _train_in_background(recipe: Path, out: Path) -> subprocess.Popen[str]:
    """`gspo train` as a child of this test, its stderr kept for the failure line."""
    return subprocess.Popen(
        [sys.executable, "-m", "gspo_cli.cli", "train", str(recipe), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_steps(proc: subprocess.Popen[str], out: Path, steps: int) -> None:
    """Until the run has logged `steps` steps (its worker is then up and sampling)."""
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().count("\n") >= steps):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()  # type: ignore[union-attr]
        time.sleep(0.05)


@pytest.mark.slow
def test_resume_after_sigkill_gives_the_records_of_the_uninterrupted_run(  # type: ignore[no-untyped-def]
    tiny_recipe, tmp_path: Path
) -> None:
    """Two batches in flight at the kill (max_staleness 2; 1 holds a subset of that case)."""
    staleness = 2
    # a checkpoint at every step: the kill comes at step 1, while the worker still has batches
    # to make (at step 2 it could already have made all five and ended: nothing to kill)
    recipe = _async_recipe(tiny_recipe, staleness, checkpoint_every=1)
    straight = tmp_path / "straight"
    result = run_cli("train", str(recipe), "--out", str(straight))
    assert result.returncode == 0, result.stderr[-2000:]
    a = _by_step(straight)
    assert sorted(a) == [1, 2, 3, 4, 5]
    # the fixed schedule: step s trains on the policy after step max(0, s - 1 - N)
    assert [a[s]["rollout_policy_version"] for s in a] == [max(0, s - 1 - staleness) for s in a]
    assert max(a[s]["rollout_staleness"] for s in a) == staleness
    assert any(a[s]["reward_std"] > 0 for s in a), "no reward signal: the test would be vacuous"

    killed = tmp_path / "killed"
    proc = train_until_checkpoint(recipe, killed)
    latest = killed / "checkpoints" / "latest"
    family = descendants(proc.pid)  # the rollout worker and its reward pools, among others
    assert _worker_pids(proc.pid), "no rollout worker found: the test would be vacuous"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert wait_gone(family) == [], "processes outlived the SIGKILLed trainer"
    stopped_at = int(latest.read_text().strip().removeprefix("step_"))
    assert stopped_at < 5
    saved = killed / "checkpoints" / latest.read_text().strip() / "rollouts_in_flight_rank0.pt"
    assert saved.is_file()

    result = run_cli("train", str(recipe), "--out", str(killed), "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    b = _by_step(killed)
    assert sorted(b) == [1, 2, 3, 4, 5]  # no step lost or repeated
    for step in range(stopped_at + 1, 6):
        assert b[step]["rollout_policy_version"] == a[step]["rollout_policy_version"]
        for key in (k for k in COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)
    later = [
        [r["completion"] for r in _records(run, "samples.jsonl") if r["step"] > stopped_at]
        for run in (straight, killed)
    ]
    assert later[0] and later[0] == later[1]  # the very same responses


@pytest.mark.slow
def test_a_dead_worker_ends_the_run_with_one_line_and_the_run_resumes(  # type: ignore[no-untyped-def]
    tiny_recipe, tmp_path: Path
) -> None:
    recipe = _async_recipe(tiny_recipe, 1, steps=200, checkpoint_every=1)
    out = tmp_path / "run"
    proc = _train_in_background(recipe, out)
    _wait_for_steps(proc, out, 2)
    workers = _worker_pids(proc.pid)
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert f"rollout worker 0 (pid {workers[0]}) died (exit code -9)" in err
    assert err.strip().endswith("resumes from its last checkpoint with --resume")
    resume = ("--resume", "--set", "trainer.steps=4", "--set", "rollout.worker_timeout_s=600")
    result = run_cli("train", str(recipe), "--out", str(out), *resume)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(_by_step(out)) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_hung_worker_ends_the_run_with_one_line(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(
        rollout={**ASYNC["rollout"], "max_staleness": 1, "worker_timeout_s": 3},
        trainer={"steps": 200, "checkpoint_every": 1000},
    )
    out = tmp_path / "run"
    proc = _train_in_background(recipe, out)
    _wait_for_steps(proc, out, 1)
    workers = _worker_pids(proc.pid)
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGSTOP)  # alive, but never sends another batch
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert f"rollout worker 0 (pid {workers[0]}) sent nothing for 3s" in err and "hangs" in err
    assert wait_gone(workers) == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["rollout.max_staleness=-1"], "rollout.max_staleness"),
        (
            ["rollout.max_staleness=1", "rollout.use_engine_logprobs=false"],
            "the loss needs that policy's log-probs",
        ),
        (["rollout.worker_threads=2"], "has no effect without rollout.max_staleness"),
        # `auto` takes the engine's log-probs as pi_old under async: renormalised by top-p
        (["rollout.max_staleness=1", "rollout.top_p=0.9"], "need top_p 1, top_k 0"),
    ],
)
def test_bad_async_settings_are_one_line_at_validate_time(
    tmp_path: Path, settings: list[str], message: str
) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: builtin:tiny-dense\n")
    args = [arg for setting in settings for arg in ("--set", setting)]
    result = invoke_cli("validate", str(recipe), *args)
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr


@pytest.mark.slow
def test_a_rollback_restarts_the_worker_on_the_restored_policy(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """lr 1e30 wrecks the first update: each rollback drops the batches the worker sampled on
    the abandoned trajectory and restarts it from the restored weights, with fresh seeds."""
    recipe = tiny_recipe(
        optimizer={"lr": 1.0e30},
        rollout={**ASYNC["rollout"], "max_staleness": 1},
        trainer={"steps": 3, "on_collapse": "rollback", "max_rollbacks": 2},
    )
    out = tmp_path / "run"
    result = invoke_cli("train", str(recipe), "--out", str(out))
    assert result.returncode == 2 and "stopped at step" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    events = _records(out, "events.jsonl")
    assert [e["action"] for e in events] == ["rollback", "rollback", "stop"]
    # every retry trains a batch the restarted worker sampled from the restored policy (a worker
    # left running would have moved past step 1: the retry would wait for it forever)
    assert all(m["rollout_policy_version"] == 0 for m in _records(out, "metrics.jsonl"))
