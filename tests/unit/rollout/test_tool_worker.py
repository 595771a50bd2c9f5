"""Users' tools run in their trajectory's own process (rollout/tools/worker.py): a call stuck in
Python or in C is killed at its deadline, an exit is an error answered to the model, a huge
result is cut before the trainer tokenises it, and what a tool started ends with the trajectory,
with Ctrl-C and with a SIGKILLed trainer. Waits are bounded, not timed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import ToolCall
from gspo_cli.rollout.tools.toolbox import FunctionToolbox
from tests.support.helpers import REPO, alive, kill_marked, marked, tool_module, wait_gone

MODULE = "gspo_test_worker_tools"
SOURCE = '''
import os
import re
import subprocess


def pid() -> int:
    """The process the tools run in."""
    return os.getpid()


def spin() -> str:
    """Never return (Python)."""
    while True:
        pass


def backtrack() -> str:
    """Never return (C code holding the GIL: a catastrophic regular expression)."""
    return str(re.match(r"(a+)+$", "a" * 64 + "b"))


def leave(code: int) -> str:
    """Exit the process.

    Args:
        code: The exit code.
    """
    os._exit(code)


def huge() -> str:
    """20 MB of text."""
    return "x" * 20_000_000


def fail() -> str:
    """A long error."""
    raise ValueError("the reason comes first " + "and then a long tail " * 20)


def sleeper(marker: str, new_session: bool) -> int:
    """Start a sleep and return its pid.

    Args:
        marker: The sleep's argument.
        new_session: Start it in a session of its own (out of the worker's process group).
    """
    return subprocess.Popen(["sleep", marker], start_new_session=new_session).pid


def sleep_and_spin(marker: str) -> str:
    """Start two sleeps, one in a session of its own, then never return.

    Args:
        marker: The sleeps' argument.
    """
    subprocess.Popen(["sleep", marker])
    subprocess.Popen(["sleep", marker], start_new_session=True)
    while True:
        pass
'''
NAMES = ("pid", "spin", "backtrack", "leave", "huge", "fail", "sleeper", "sleep_and_spin")


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example tool module, importable as MODULE."""
    with tool_module(tmp_path, monkeypatch, MODULE, SOURCE, "pid") as module:
        yield module


def _toolbox(tools: ModuleType, tokenizer: Any = None, **settings: Any) -> FunctionToolbox:
    functions = {name: getattr(tools, name) for name in NAMES}
    return FunctionToolbox(ToolSettings(**settings), tokenizer or build_char_tokenizer(), functions)


@pytest.mark.parametrize("tool", ["spin", "backtrack"])
def test_a_call_stuck_in_python_or_c_is_killed_at_its_deadline(
    tools: ModuleType, tool: str
) -> None:
    toolbox = _toolbox(tools, timeout_s=0.5)
    first, stuck, later = toolbox.run(
        [ToolCall("pid", {}), ToolCall(tool, {}), ToolCall("pid", {})]
    )
    assert stuck.error and stuck.text == f"TimeoutError: tool {tool} ran past 0.5 s"
    assert stuck.seconds < 10
    assert later.error and later.text.startswith("the tools are unavailable")
    assert wait_gone([int(first.text)], timeout=10) == []  # killed, not left spinning
    toolbox.close()


def test_a_tool_that_exits_is_an_error_answered_to_the_model(tools: ModuleType) -> None:
    toolbox = _toolbox(tools)
    exited, later = toolbox.run([ToolCall("leave", {"code": 7}), ToolCall("pid", {})])
    assert exited.error and exited.text == "ProcessExit: tool leave ended its process (exit code 7)"
    assert later.error and "unavailable" in later.text
    assert toolbox.reward() is None  # no environment
    toolbox.close()


class _SpyTokenizer:
    """A tokenizer that remembers the longest text it was given."""

    def __init__(self) -> None:
        self.inner = build_char_tokenizer()
        self.longest = 0

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.longest = max(self.longest, len(text))
        return self.inner(text, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        return str(self.inner.decode(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # special tokens and the rest: the real one's
        return getattr(self.inner, name)


@pytest.mark.parametrize("side", ["head", "tail"])
def test_a_huge_result_is_cut_before_it_is_tokenised(tools: ModuleType, side: str) -> None:
    spy = _SpyTokenizer()
    toolbox = _toolbox(tools, spy, output_max_tokens=64, output_truncation=side)
    (result,) = toolbox.run([ToolCall("huge", {})])
    assert result.cut and not result.error
    assert spy.longest <= 64 * 32  # what the trainer tokenised: not 20 MB
    marker = "19999936 characters cut"
    expected = f"{'x' * 64}\n[... {marker}]" if side == "head" else f"[{marker} ...]\n{'x' * 64}"
    assert result.text == expected
    toolbox.close()


def test_an_error_keeps_its_type_and_message_head_when_cut(tools: ModuleType) -> None:
    toolbox = _toolbox(tools, output_max_tokens=24, output_truncation="tail")
    (result,) = toolbox.run([ToolCall("fail", {})])
    assert result.error and result.cut
    assert result.text.startswith("ValueError: the reason")  # 24 characters kept
    toolbox.close()


@pytest.mark.parametrize(("new_session", "marker"), [(False, "987661"), (True, "987664")])
def test_what_a_tool_started_ends_with_its_trajectory(
    tools: ModuleType, new_session: bool, marker: str
) -> None:
    toolbox = _toolbox(tools)
    try:
        call = ToolCall("sleeper", {"marker": marker, "new_session": new_session})
        (started,) = toolbox.run([call])
        assert alive([int(started.text)]) == [int(started.text)]
        toolbox.close()
        assert wait_gone(marked(marker), timeout=30) == []
    finally:
        kill_marked(marker)


# the trainer's side of the pipe: the worker alone (no tokenizer, no transformers import)
TRAINER = """
import sys
sys.path.insert(0, {folder!r})
import {module} as tools
from gspo_cli.rollout.tools.worker import ToolSetup, ToolWorker

worker = ToolWorker(ToolSetup({{"sleep_and_spin": tools.sleep_and_spin}}, None, 2048, "tail"))
worker.request("call", "sleep_and_spin", {{"marker": {marker!r}}}, timeout_s=600)
"""


@pytest.mark.parametrize(
    ("signum", "marker"), [(signal.SIGINT, "987662"), (signal.SIGKILL, "987663")]
)
def test_ctrl_c_or_a_sigkill_ends_a_hung_tool_and_what_it_started(
    tmp_path: Path, signum: int, marker: str
) -> None:
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    script = TRAINER.format(folder=str(tmp_path), module=MODULE, marker=marker)
    trainer = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = wait_for(lambda: len(marked(marker)) == 2 or trainer.poll() is not None)
        assert started, "the sleeps never started"
        assert marked(marker), trainer.communicate()[1][-2000:]
        trainer.send_signal(signum)
        _, stderr = trainer.communicate(timeout=60)  # not the tool's 600-s deadline
        if signum == signal.SIGINT:
            assert "KeyboardInterrupt" in stderr
        assert wait_gone(marked(marker), timeout=30) == []
    finally:
        trainer.kill()
        kill_marked(marker)


def wait_for(condition: Any, timeout: float = 120) -> bool:
    """True once `condition()` holds (polled), False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False
