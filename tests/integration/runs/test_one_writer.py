"""A run or eval folder has one writer: `gspo train` (with or without --resume), `gspo sft` and
`gspo eval --out` on a folder in use exit 2 naming the holder; a killed holder never blocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gspo_cli.runs.folder import LOCK
from tests.support.helpers import REPO, invoke_cli, lock_holder, run_cli, write_recipe

QUICK = {
    "model": {"path": "builtin:tiny-dense"},
    "cold_start": {"enabled": True, "steps": 2},
    "trainer": {"steps": 1},
}


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path, QUICK)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A folder whose lock another process holds: (the folder, that process's pid)."""
    folder = tmp_path / "run"
    with lock_holder(folder) as (proc, _):
        yield folder, proc.pid


def _names_holder(result: subprocess.CompletedProcess[str], folder: Path, pid: int) -> None:
    """Exit 2 with one line: the folder, and the holder's pid and host."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{folder} is in use by " in lines[0], lines[0]
    assert f"pid {pid} on host {socket.gethostname()}" in lines[0], lines[0]


@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_train_on_a_folder_in_use_names_the_holder(
    recipe: Path, held: tuple[Path, int], flags: list[str]
) -> None:
    folder, pid = held
    _names_holder(invoke_cli("train", str(recipe), "--out", str(folder), *flags), folder, pid)


def test_sft_on_a_folder_in_use_names_the_holder(recipe: Path, held: tuple[Path, int]) -> None:
    folder, pid = held
    _names_holder(invoke_cli("sft", str(recipe), "--out", str(folder)), folder, pid)


def test_eval_out_in_use_names_the_holder(tmp_path: Path, held: tuple[Path, int]) -> None:
    folder, pid = held
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"question": "Compute 1+2.", "answer": "3"}) + "\n")
    args = ["builtin:tiny-dense", "--benchmark", "custom", "--data", str(data)]
    for resume in ([], ["--resume"]):
        result = invoke_cli("eval", *args, "--out", str(folder), *resume)
        _names_holder(result, folder, pid)
    assert sorted(p.name for p in folder.iterdir()) == [LOCK]  # nothing written beside it


@pytest.mark.slow
def test_a_second_train_is_refused_and_a_killed_one_resumes(recipe: Path, tmp_path: Path) -> None:
    """The report: two `gspo train` on one --out, the second 0.5 s later, both ran and mixed
    their records. Now the second exits 2 naming the first; SIGKILL the first and a resume
    runs (the kernel dropped the lock), with one run's records."""
    out = tmp_path / "run"
    long = ("--set", "trainer.steps=50")  # still running when the second one starts
    first = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli.cli", "train", str(recipe), "--out", str(out), *long],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "recipe.yaml").is_file() and time.monotonic() < deadline:
            assert first.poll() is None, "the first run ended early"
            time.sleep(0.05)
        second = run_cli("train", str(recipe), "--out", str(out), "--set", "trainer.seed=2")
        _names_holder(second, out, first.pid)
        assert "gspo train" in second.stderr
        assert f'"pid": {first.pid}' in (out / LOCK).read_text()
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert (out / LOCK).is_file()  # the killed run's record stays; its lock went with it
    resumed = run_cli("train", str(recipe), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # (no check for DeepSpeed's import banner any more: with accelerate installed for GGUF
    # loading, transformers' save_pretrained imports deepspeed to unwrap a model, torch engine
    # or not; the torch engine still never starts it)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]
    assert not (out / LOCK).exists()
