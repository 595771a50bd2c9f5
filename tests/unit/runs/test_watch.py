"""`gspo watch RUN`: a run folder read while it is written (a torn last line skipped), shown as
sparklines, held-out with intervals per environment, the guard's events and the last samples;
live while its writer's pid is alive, then it returns; not a run folder: one line, exit 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

from rich.console import Console

from gspo_cli.runs.watch import read_snapshot
from gspo_cli.runs.watch_view import render, sparkline, watch_run
from tests.support.helpers import run_cli


def make_run(folder: Path, steps: int = 3, total: int = 10) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".gspo-run").write_text(json.dumps({"kind": "run"}))
    (folder / "recipe.yaml").write_text(f"trainer:\n  steps: {total}\n  on_collapse: rollback\n")
    (folder / "checkpoints").mkdir(exist_ok=True)
    (folder / "checkpoints" / "latest").write_text("step_000002\n")
    lines = [
        json.dumps({"step": s, "reward_mean": 0.1 * s, "loss": 1.0 / s, "time_step_s": 30.0})
        for s in range(1, steps + 1)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "rew')  # torn
    heldout = {
        "step": 2, "accuracy": 0.25, "accuracy_ci_low": 0.2, "accuracy_ci_high": 0.3,
        "env/sums/accuracy": 0.5, "env/sums/accuracy_ci_low": 0.4, "env/sums/accuracy_ci_high": 0.6,
    }  # fmt: skip
    (folder / "eval.jsonl").write_text(json.dumps({"step": 0, "accuracy": 0.1}) + "\n"
                                       + json.dumps(heldout) + "\n")  # fmt: skip
    samples = [
        {"step": 2, "prompt": "stale prompt", "completion": "x", "reward": 0.0},
        {"step": 3, "prompt": "Compute 2+2.", "completion": "\\boxed{4}", "reward": 1.0,
         "tool_calls": 2},
    ]  # fmt: skip
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    event = {"step": 3, "signal": "reward", "action": "rollback", "detail": "reward fell"}
    (folder / "events.jsonl").write_text(json.dumps(event) + "\n")
    return folder


def shown(folder: Path) -> str:
    console = Console(record=True, width=160)
    console.print(render(read_snapshot(folder)))
    return console.export_text()


def test_a_run_folder_is_read_and_shown(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    snap = read_snapshot(run)
    assert snap.step == 3 and snap.total_steps == 10 and snap.writer is None
    assert snap.series("reward_mean") == [0.1, 0.2, 0.30000000000000004]  # the torn line: not yet
    text = shown(run)
    assert "step 3/10" in text and "not running" in text and "step_000002" in text
    assert "reward" in text and sparkline(snap.series("reward_mean")) in text
    assert "held-out at step 2: 25.0% [20.0, 30.0]" in text and "sums 50.0% [40.0, 60.0]" in text
    assert "on_collapse rollback" in text and "step 3: reward -> rollback (reward fell)" in text
    assert "samples of step 3" in text and "Compute 2+2." in text and "stale prompt" not in text


def test_a_live_writer_shows_an_eta_and_the_view_ends_with_it(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    writer = subprocess.Popen(["sleep", "60"])
    record = {"pid": writer.pid, "host": socket.gethostname(), "command": "gspo train"}
    (run / ".gspo.lock").write_text(json.dumps(record))
    try:
        text = shown(run)
        assert f"running (pid {writer.pid})" in text and "eta 3m30s" in text  # 7 steps x 30 s
        done = threading.Event()
        console = Console(file=open(os.devnull, "w"), width=120)  # noqa: SIM115
        thread = threading.Thread(
            target=lambda: (watch_run(run, console, interval=0.05), done.set()), daemon=True
        )
        thread.start()
        assert not done.wait(0.5)  # refreshing while the writer lives
        writer.kill()
        writer.wait()
        assert done.wait(30)  # the writer's end ends the view
    finally:
        writer.kill()
    assert "not running" in shown(run)  # its lock file left behind by a kill: not a writer


def test_sparklines_scale_to_their_own_range() -> None:
    assert sparkline([1.0, 2.0, 3.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([]) == ""


def test_the_command_shows_a_run_and_refuses_other_folders(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    result = run_cli("watch", str(run), "--once")
    assert result.returncode == 0, result.stderr
    assert "step 3/10" in result.stdout
    other = run_cli("watch", str(tmp_path))
    assert other.returncode == 2
    assert (
        other.stderr.strip()
        == f"error: {tmp_path} is not a gspo run folder (no run marker or checkpoints)"
    )
