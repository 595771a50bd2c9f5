"""`gspo train` end to end through the CLI: run folder, resume after SIGKILL, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_cli.runs.folder import RUN_MARKER
from tests.support.helpers import REPO, invoke_cli, run_cli, train_until_checkpoint

COMPARED = (
    "loss",
    "reward_mean",
    "grad_norm",
    "entropy",
    "seq_ratio_mean",
    "clip_frac",
    "response_len_mean",
)


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


@pytest.mark.slow
@pytest.mark.container  # a short training run, in the container too
def test_train_writes_a_complete_run_folder(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(trainer={"steps": 2, "checkpoint_every": 1, "keep_checkpoints": 1})
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    run = tmp_path / "run"
    assert "held-out accuracy" in result.stdout
    metrics = _metrics(run)
    assert sorted(metrics) == [1, 2]
    for key in (
        "reward_mean",
        "reward_std",
        "accuracy",
        "clip_frac_low",
        "clip_frac_high",
        "zero_adv_skipped_frac",
        "grad_norm",
        "lr",
        "response_len_mean",
        "response_len_max",
        "truncated_frac",
        "zero_adv_groups",
        "time_rollout_s",
        "time_reward_s",
        "time_train_s",
        "tokens_per_s",
        "peak_memory_mb",
        "heldout_accuracy",
    ):
        assert key in metrics[2], key
    # statistics of the trained tokens: in every step that trained some (not all rows skipped)
    trained = [rec for rec in metrics.values() if rec["zero_adv_skipped_frac"] < 1]
    assert trained and all("seq_ratio_max" in r and "entropy" in r for r in trained)
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2]
    assert (run / "recipe.yaml").is_file() and (run / "samples.jsonl").is_file()
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert checkpoints == ["step_000002"]  # keep_checkpoints=1 pruned step 1
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    # The checkpoint is a standard HF folder that transformers loads as is.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000002")
    AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000002")


@pytest.mark.slow
def test_resume_after_sigkill_reproduces_the_uninterrupted_run(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(trainer={"steps": 4, "checkpoint_every": 2})
    straight = tmp_path / "straight"
    result = run_cli("train", str(recipe), "--out", str(straight))
    assert result.returncode == 0, result.stderr[-2000:]

    killed = tmp_path / "killed"
    proc = train_until_checkpoint(recipe, killed)
    latest = killed / "checkpoints" / "latest"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    stopped_at = int(latest.read_text().strip().removeprefix("step_"))
    assert stopped_at < 4

    result = run_cli("train", str(recipe), "--out", str(killed), "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    a, b = _metrics(straight), _metrics(killed)
    assert sorted(b) == list(range(1, 5))  # no step lost or repeated
    assert any(a[s]["reward_std"] > 0 for s in a), (
        "rewards carry no signal: the test would be vacuous"
    )
    for step in range(stopped_at + 1, 5):
        # a step whose rows were all skipped has no statistics of trained tokens, in both runs
        for key in (k for k in COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)


def test_existing_run_folder_needs_resume(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_MARKER).write_text('{"kind": "run"}\n')  # a run folder of ours, with progress
    (out / "metrics.jsonl").write_text("{}\n")
    result = invoke_cli("train", str(tiny_recipe()), "--out", str(out))
    assert result.returncode == 2
    assert "already exists" in result.stderr and "Traceback" not in result.stderr


def test_missing_model_path_exits_2_with_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: ./no/such/model\n")
    result = invoke_cli("train", str(recipe), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "model.path: file not found: " in result.stderr
    assert result.stderr.rstrip().endswith("/no/such/model")


def test_unloadable_hub_model_exits_2(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: nobody/no-such-model\n")
    env_run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gspo_cli.cli",
            "train",
            str(recipe),
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert env_run.returncode == 2
    assert (
        "model.path: 'nobody/no-such-model' is neither a local folder nor in the local hub cache, "
        "and HF_HUB_OFFLINE is set" in env_run.stderr
    )
    assert "Traceback" not in env_run.stderr


def test_corrupted_checkpoint_is_reported(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(trainer={"steps": 1, "checkpoint_every": 1})
    out = tmp_path / "run"
    assert invoke_cli("train", str(recipe), "--out", str(out)).returncode == 0
    (out / "checkpoints" / "step_000001" / "trainer_state.pt").write_bytes(b"garbage")
    bigger = tiny_recipe(trainer={"steps": 1, "checkpoint_every": 1})
    result = invoke_cli("train", str(bigger), "--out", str(out), "--resume")
    assert result.returncode == 2
    assert "is corrupted" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_wandb_offline_logging_needs_no_network(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(trainer={"steps": 1}, logging={"wandb": True, "wandb_mode": "offline"})
    out = tmp_path / "run"
    result = run_cli("train", str(recipe), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
