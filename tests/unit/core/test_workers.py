"""No child process outlives a SIGKILLed parent: maths verifier workers, sandboxed programs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gspo_cli.sandbox.isolation import available_modes
from gspo_cli.sandbox.launch import MARKER_PREFIX
from tests.support.helpers import REPO, interruptible

# The container stage of CI runs these too: process death signals in its PID namespace.
pytestmark = pytest.mark.container


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                table[int(entry.name)] = int(ppid)
    return table


def _descendants(root: int) -> list[int]:
    table = _parents()
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, ppid in table.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _wait_until(predicate, timeout: float = 60) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(predicate())


def _kill_and_check(script: str, args: list[str], ready) -> None:  # type: ignore[no-untyped-def]
    """Run `script`; once `ready(descendants)`, SIGKILL it and require every descendant gone."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=interruptible,
    )
    children: list[int] = []
    try:
        assert _wait_until(lambda: proc.poll() is None and ready(_descendants(proc.pid))), (
            "the children never started: the test would be vacuous"
        )
        children = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        alive = _parents()
        assert _wait_until(lambda: not set(children) & set(_parents())), [
            _cmdline(p) for p in children if p in alive
        ]
    finally:
        # A failed test leaves no orphan either (sandboxed programs have their own session).
        live = _parents()
        for pid in [proc.pid, *[c for c in children if c in live]]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


POOL = """
import time
from gspo_cli.rewards.math_verifier import MathVerifierPool
pool = MathVerifierPool(num_workers=2)
pool.score(["\\\\boxed{1}"], ["1"])
time.sleep(600)
"""


def test_maths_verifier_workers_die_with_a_sigkilled_parent() -> None:
    _kill_and_check(POOL, [], lambda kids: len(kids) >= 2)


def _signal_group_when_ready(script: str, sig: int, **popen: Any) -> tuple[int, str, str]:
    """Run `script` in a session of its own; once it prints "ready", send `sig` to its whole
    process group and return (exit code, stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out, err


def test_maths_verifier_workers_ignore_ctrl_c() -> None:
    """Ctrl-C reaches the whole process group; only the parent may react (no worker traceback)."""
    script = POOL.replace("time.sleep(600)", "print('ready', flush=True)\ntime.sleep(600)")
    _, _, err = _signal_group_when_ready(script, signal.SIGINT, preexec_fn=interruptible)
    # The parent's own KeyboardInterrupt (no handler in this script) is the one traceback.
    assert err.count("Traceback") == 1, err
    assert "_process_worker" not in err, err


def test_maths_verifier_workers_do_not_get_a_signal_sent_to_the_trainers_group() -> None:
    """torchrun stops a rank with SIGTERM to the rank's whole process group; the trainer stops
    at its step boundary, still scoring with its workers (a broken pool would score 0.0)."""
    script = POOL.replace(
        "time.sleep(600)",
        "import signal\n"
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda *_: got.append(1))\n"
        "print('ready', flush=True)\n"
        "while not got:\n"
        "    time.sleep(0.01)\n"
        "print(pool.score(['\\\\boxed{2}'], ['2']), flush=True)\n",
    )
    returncode, out, err = _signal_group_when_ready(script, signal.SIGTERM)
    assert (returncode, out.strip(), err) == (0, "[1.0]", "")


SANDBOXED_SLEEP = """
import sys
from gspo_cli.sandbox.program import Limits, run_program
run_program(
    "import time\\ntime.sleep(600)",
    limits=Limits(time_limit_s=600),
    isolation=sys.argv[1],
    allow_weak_isolation=True,  # the weak modes are tested too, by explicit opt-in
)
"""


# Every mode: bwrap and unshare end with their pid namespace; rlimits (weak isolation, opt-in)
# by parent-death signals, and as root through its sentinel (harness/runner.py), since the
# kernel drops the checker's parent-death signal to the program's other uid.
MODES = available_modes()


@pytest.mark.parametrize("mode", MODES)
def test_a_sandboxed_program_dies_with_a_sigkilled_judge(mode: str) -> None:
    # Ready once the harness runs (argv[0] python): the wrappers before it (setpriv, bwrap,
    # unshare) carry the marker from fork on, before they have asked for the parent-death signal.
    def harness_running(kids: list[int]) -> bool:
        argvs = [_cmdline(p).split(b"\0") for p in kids]
        return any(b"python" in a[0] and MARKER_PREFIX.encode() in b" ".join(a) for a in argvs)

    _kill_and_check(SANDBOXED_SLEEP, [mode], harness_running)
