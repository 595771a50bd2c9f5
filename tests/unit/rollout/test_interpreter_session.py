"""The interpreter tool keeps one live sandboxed session per trajectory (issue 52.A): what a cell
saw is what the next cell sees; a call that times out, exhausts memory, floods its output or
ends the process ends the session, says so in one line and is never a success; the next call
starts afresh; nothing outlives the session, even a SIGKILLed trainer."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.rollout.tools.base import ToolSettings
from gspo_cli.rollout.tools.interpreter import RESTARTED, PythonInterpreter
from gspo_cli.sandbox import CellOutcome, Limits, SandboxSession, available_modes
from tests.support.helpers import REPO, marked, survivors_of_sigkill, wait_gone

TOKENIZER = build_char_tokenizer()
SETTINGS = ToolSettings(
    timeout_s=2.0, memory_mb=256, output_max_bytes=4096, max_calls=16, output_max_tokens=400
)
# what differs in a container: the isolation modes the sessions run under (docs/docker.md)
pytestmark = pytest.mark.container


@pytest.fixture
def box() -> Iterator[PythonInterpreter]:
    interpreter = PythonInterpreter(SETTINGS, TOKENIZER)
    yield interpreter
    interpreter.close()


def test_what_a_cell_saw_is_what_the_next_cell_sees(box: PythonInterpreter) -> None:
    drawn = box.run_code("import random, time\nx, t = random.random(), time.time()\nx")
    assert box.run_code("x").text == drawn.text  # a replay would draw again
    assert box.run_code("t == time.time()").text == "False"  # the clock moved on, t did not
    assert box.run_code("open('notes.txt', 'w').write('kept')").text == "4"
    assert box.run_code("open('notes.txt').read()").text == "'kept'"
    failed = box.run_code("y = 1\n1/0")
    assert failed.error and failed.text == "ZeroDivisionError: division by zero"
    assert box.run_code("y").text == "1"  # what ran before the error stays, as in a notebook
    exited = box.run_code("import sys; sys.exit(3)")
    assert exited.error and exited.text == "SystemExit: 3" and not exited.restarted
    assert box.restarts == 0 and box.session.live


@pytest.mark.parametrize(
    ("cell", "why"),
    [
        ("import os; os._exit(0)", "ProcessExit: the cell ended the interpreter (exit code 0)"),
        ("import os, signal; os.kill(os.getpid(), 9)", "(signal 9)"),
        ("while True: pass", "TimeoutError: the cell ran past 2 s"),
        ("b = bytearray(1 << 30)", "MemoryError: the interpreter used more than 256 MB"),
        ("print('x' * 100_000)", "[output past 4096 bytes dropped]"),
    ],
)
def test_a_call_that_ends_the_session_says_so_and_the_next_starts_afresh(
    box: PythonInterpreter, cell: str, why: str
) -> None:
    box.run_code("kept = 7")
    ended = box.run_code(cell)
    assert ended.error and ended.restarted, ended
    assert why in ended.text and ended.text.endswith(RESTARTED), ended.text
    assert box.restarts == 1 and not box.session.live
    after = box.run_code("1/0")  # never a silent success after an exit
    assert after.error and after.text == "ZeroDivisionError: division by zero"
    assert "NameError" in box.run_code("kept").text  # a fresh interpreter


def test_output_written_after_a_cell_shows_once_in_the_next_call(box: PythonInterpreter) -> None:
    started = box.run_code(
        "import os, threading, time\n"
        "def late():\n    time.sleep(0.3)\n    os.write(1, b'late\\n')\n"
        "threading.Thread(target=late).start()\n'started'"
    )
    assert started.text == "'started'"
    assert box.run_code("time.sleep(0.6)\n'waited'").text == "late\n'waited'"
    assert box.run_code("'again'").text == "'again'"  # not replayed into later results


def test_a_session_leaves_nothing_when_it_ends(box: PythonInterpreter) -> None:
    box.run_code("import subprocess\np = subprocess.Popen(['sleep', '987661'])")
    assert marked("987661")
    box.close()
    assert wait_gone(marked("987661"), timeout=30) == []


SIGKILLED = """
import sys, time
from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.rollout.tools.base import ToolSettings
from gspo_cli.rollout.tools.interpreter import PythonInterpreter
box = PythonInterpreter(ToolSettings(allow_weak_isolation=True), build_char_tokenizer())
box.run_code("import subprocess\\np = subprocess.Popen(['sleep', '987662'])")
time.sleep(600)
"""


def test_a_sigkilled_trainer_leaves_no_session(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", SIGKILLED]
    assert survivors_of_sigkill(argv, "987662", REPO, timeout=120) == []


@pytest.mark.parametrize("mode", [m for m in ("unshare", "rlimits") if m in available_modes()])
def test_the_weak_modes_keep_state_and_restart_alike(mode: str) -> None:
    settings = replace(SETTINGS, allow_weak_isolation=True)
    box = PythonInterpreter(settings, TOKENIZER)
    box.session.isolation = mode
    try:
        drawn = box.run_code("import random\nx = random.random()\nx")
        assert box.run_code("x").text == drawn.text
        ended = box.run_code("import os; os._exit(5)")
        assert ended.restarted and "(exit code 5)" in ended.text
        assert "NameError" in box.run_code("x").text
        assert "SandboxViolation" in box.run_code("open('/etc/hostname').read()").text
    finally:
        box.close()


# --- a hostile or careless cell against the session's channels (sandbox/session.py) ---------

# The session's descriptors, as a cell finds them: serve()'s locals, up its frames.
FIND = (
    "import os, sys\nf = sys._getframe()\nwhile 'reply_fd' not in f.f_locals:\n"
    "    f = f.f_back\nR, C = f.f_locals['reply_fd'], f.f_locals['cell_fd']\n"
)
HUGE = "os.write(R, (1 << 40).to_bytes(8, 'little'))"


def _session() -> SandboxSession:
    return SandboxSession(Limits(time_limit_s=2, memory_limit_mb=256), cpu_budget_s=30)


def _in_thread(call: Callable[[], CellOutcome]) -> CellOutcome:
    """`call()` on a pool thread (as the rollout makes calls), bounded: a hang fails the test."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=120)


def test_an_answer_the_harness_never_sends_ends_the_session() -> None:
    session = _session()
    try:
        huge = _in_thread(lambda: session.run(FIND + HUGE))
        assert huge.ended == "protocol" and not session.live
        assert _in_thread(lambda: session.run("2 + 2")).stdout == b"4\n"
    finally:
        session.close()


def test_a_cell_that_blocks_the_cell_pipe_cannot_hang_the_next_call() -> None:
    session = _session()
    block = (
        "import fcntl\nfcntl.fcntl(C, 1031, 4096)\n"  # F_SETPIPE_SZ: the smallest pipe
        'os.write(R, (35).to_bytes(8, \'little\') + b\'{"t": "dict", "v": [["n", 2]]}\')\n'
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\n"
        "time.sleep(600)"
    )
    try:
        first = _in_thread(lambda: session.run(FIND + block))
        assert first.ended == "timeout"  # its forged answer was for another cell
        big = _in_thread(lambda: session.run("x = '" + "a" * 200_000 + "'\nlen(x)"))
        assert big.stdout == b"200000\n"  # a fresh session took the long cell
    finally:
        session.close()


def test_a_forked_child_never_answers_for_its_parent() -> None:
    session = _session()
    try:
        session.run("import os, time\npid = os.fork()")  # the child stays in the cell
        for cell, shown in [("time.sleep(0.2); print('A')", b"A\n"), ("print('B')", b"B\n")]:
            assert session.run(cell).stdout == shown
    finally:
        session.close()


def test_a_session_whose_thread_ended_is_reported_lost() -> None:
    session = _session()
    try:
        assert _in_thread(lambda: session.run("x = 1")).error is None  # that thread then ends
        lost = session.run("x")
        assert lost.ended == "lost" and not session.live
        assert "NameError" in (session.run("x").error or "")
    finally:
        session.close()
