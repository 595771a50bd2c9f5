"""Stopping `gspo train` from outside: SIGKILL leaves no worker behind; SIGTERM and Ctrl-C end
with one line that says where the run stopped and the exact command that resumes it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gspo_cli.core.errors import Stopped
from gspo_cli.recipe import load_recipe
from gspo_cli.runs.folder import CHECKPOINTS, LATEST
from gspo_cli.train.run.prepare import prepare_run
from gspo_cli.train.run.signals import stop_on_signals
from tests.support.helpers import (
    REPO,
    children,
    descendants,
    interruptible,
    run_cli,
    wait_gone,
    write_recipe,
)

# builtin:tiny-dense, no cold start: the first step comes within seconds; 200 steps outlast
# every test, which stops the run itself.
LONG_RUN = {
    "model": {"path": "builtin:tiny-dense"},
    "trainer": {"steps": 200, "checkpoint_every": 1000, "stop_grace_s": 2},
    "reward": {"num_workers": 2},
}


class Trainer:
    """`gspo train` in its own session, output in files: an orphan holding a pipe open must not
    hang the test, and a signal to the group is what a terminal's Ctrl-C sends."""

    def __init__(self, tmp_path: Path, nproc: int = 1, **overrides: object) -> None:
        from gspo_cli.recipe import deep_merge

        self.recipe = write_recipe(tmp_path, deep_merge(LONG_RUN, overrides))
        self.out = tmp_path / "run"
        self.argv = ["train", str(self.recipe), "--out", str(self.out)]
        self.argv += ["--nproc", str(nproc)] if nproc > 1 else []
        self.stdout, self.stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gspo_cli.cli", *self.argv],
                cwd=REPO,
                stdout=out,
                stderr=err,
                env={**os.environ, "COLUMNS": "300"},
                start_new_session=True,
                preexec_fn=interruptible,
            )

    def wait_for_step(self, step: int, timeout: float = 300) -> None:
        metrics = self.out / "metrics.jsonl"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            lines = metrics.read_text().splitlines() if metrics.is_file() else []
            if len(lines) >= step:
                return
            time.sleep(0.05)
        raise AssertionError(f"no step {step}: {self.stderr.read_text()[-2000:]}")

    def finish(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """The whole group: orphans of a failed test die too (they kept the group id)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def trainer(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[Trainer] = []

    def start(nproc: int = 1, **overrides: object) -> Trainer:
        started.append(Trainer(tmp_path, nproc, **overrides))
        return started[-1]

    yield start
    for t in started:
        t.kill()


@pytest.mark.slow
def test_sigkill_leaves_no_worker_alive(trainer) -> None:  # type: ignore[no-untyped-def]
    run = trainer()
    run.wait_for_step(1)  # held-out accuracy at step 0 has started the verifier workers
    workers = children(run.proc.pid)
    assert len(workers) >= 2, "the maths verifier workers were not found: the test would be vacuous"
    os.kill(run.proc.pid, signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    assert wait_gone(workers) == [], "workers outlived the SIGKILLed trainer"


def _stop_line(run: Trainer) -> str:
    err = run.stderr.read_text()
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
def test_sigterm_stops_with_one_line_that_matches_the_run_folder(trainer) -> None:  # type: ignore[no-untyped-def]
    run = trainer()
    run.wait_for_step(2)
    workers = children(run.proc.pid)
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    line = _stop_line(run)
    assert line.startswith("stopped at step ")
    command = f"gspo train {run.recipe} --out {run.out} --resume"
    assert line.endswith(f"; resume with: {command}"), line
    # The line states what is on disk: the checkpoint it names is the one a resume would use.
    done = len((run.out / "metrics.jsonl").read_text().splitlines())
    assert line.startswith(f"stopped at step {done} ")
    pointer = run.out / CHECKPOINTS / LATEST
    if pointer.is_file():  # a stop at a step boundary checkpoints that step
        assert pointer.read_text().strip() == f"step_{done:06d}"
        assert "(checkpoint saved)" in line
    else:
        assert "no checkpoint yet: a resume starts from step 0" in line
    assert wait_gone(workers) == []


@pytest.mark.slow
def test_ctrl_c_stops_with_one_line_and_no_worker_traceback(trainer) -> None:  # type: ignore[no-untyped-def]
    run = trainer()
    run.wait_for_step(1)
    workers = children(run.proc.pid)
    os.killpg(run.proc.pid, signal.SIGINT)  # a terminal sends Ctrl-C to the whole group
    assert run.finish() == 130
    line = _stop_line(run)
    assert line.startswith("stopped at step ") and line.endswith(" --resume"), line
    assert wait_gone(workers) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_two_processes_stop_with_one_line_and_leave_no_process(trainer, signum: int) -> None:  # type: ignore[no-untyped-def]
    """`--nproc 2`: SIGTERM goes to `gspo train` alone (as a scheduler sends it), Ctrl-C to its
    whole group (as a terminal does). The ranks stop together at a step boundary and checkpoint
    it; torchrun, the ranks and their verifier workers end, and only `gspo train` prints."""
    pytest.importorskip("deepspeed")
    # A long grace: on a busy machine a step may take more than LONG_RUN's 2 s.
    run = trainer(nproc=2, trainer={"engine": "deepspeed", "stop_grace_s": 120})
    run.wait_for_step(2)
    launched = descendants(run.proc.pid)  # torchrun, its 2 ranks, their verifier workers
    assert len(launched) >= 5, "ranks or workers not found: the test would be vacuous"
    if signum == signal.SIGTERM:
        os.kill(run.proc.pid, signum)
    else:
        os.killpg(run.proc.pid, signum)
    assert run.finish(timeout=300) == 128 + signum, run.stderr.read_text()[-3000:]
    line = _stop_line(run)  # the only line on stderr, from any process, and no traceback
    done = len((run.out / "metrics.jsonl").read_text().splitlines())
    command = f"gspo train {run.recipe} --out {run.out} --nproc 2 --resume"
    assert line == f"stopped at step {done} (checkpoint saved); resume with: {command}"
    assert (run.out / CHECKPOINTS / LATEST).read_text().strip() == f"step_{done:06d}"
    assert wait_gone(launched) == [], "processes outlived the stopped run"


@pytest.mark.slow
def test_stop_at_boundary_checkpoints_the_step_and_a_resume_continues_after_it(
    tmp_path: Path,
) -> None:
    """The loop's SIGTERM hook (PreparedRun.stop_at_boundary), driven directly."""
    recipe_file = write_recipe(tmp_path, {**LONG_RUN, "trainer": {"steps": 5}})
    recipe = load_recipe(recipe_file)
    out = tmp_path / "run"
    run = prepare_run(recipe, recipe_file.read_text(), out, False, None)
    try:
        run.stop_at_boundary(3)  # nothing asked: nothing happens
        assert not (out / CHECKPOINTS).exists()
        run.stop.signum = signal.SIGTERM  # what the handler's first SIGTERM does
        with pytest.raises(Stopped) as stopped:
            run.stop_at_boundary(3)
        assert stopped.value.exit_code == 143
    finally:
        run.close()
    assert (out / CHECKPOINTS / LATEST).read_text().strip() == "step_000003"
    resumed = prepare_run(recipe, recipe_file.read_text(), out, True, None)
    try:
        assert resumed.start == 3
    finally:
        resumed.close()


def test_sigterm_asks_first_and_stops_on_a_second_or_when_the_grace_ends() -> None:
    with stop_on_signals(grace_s=600) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM  # asked, not stopped
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, in the main thread
    with pytest.raises(Stopped), stop_on_signals(grace_s=0.2) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(600):  # no boundary comes: the grace timer stops the run
            time.sleep(0.1)
    assert signal.getsignal(signal.SIGTERM) is not stop.handle  # the handler is removed after


@pytest.mark.slow
def test_sigterm_stops_gspo_eval_with_one_line_and_the_resume_finishes(
    tmp_path: Path, shared: Path
) -> None:
    out = tmp_path / "eval"
    data = shared / "benchmarks" / "gsm8k" / "qwen25math_gsm8k_test.jsonl"
    argv = [
        "eval", "builtin:tiny-dense", "--benchmark", "gsm8k", "--data", str(data),
        "--limit", "8", "--samples", "32", "--max-new-tokens", "48", "--out", str(out),
    ]  # fmt: skip  # 32 samples: two problems per generate call, four calls
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gspo_cli.cli", *argv],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "COLUMNS": "300"},
        )
    try:
        samples = out / "samples.jsonl"
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not samples.is_file():
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, err.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.read_text()
    lines = text.strip().splitlines()  # progress lines ("eval 1/8 problems, ..."), then the stop
    assert "Traceback" not in text and all(x.startswith("eval ") for x in lines[:-1]), text
    done = len(samples.read_text().splitlines())
    assert 0 < done < 8
    command = f"gspo {' '.join(argv)} --resume"
    assert lines[-1] == f"stopped with {done} problem(s) done in {out}; resume with: {command}"
    resumed = run_cli(*argv, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"({done} already done)" in resumed.stdout
