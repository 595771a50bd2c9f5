"""Users' tools run in a process of their own, one per trajectory, so a call can be stopped.

A thread cannot be stopped, and a signal cannot interrupt C code that holds the GIL (a regular
expression backtracking for ever): only a process can be killed. The worker is forked (by the
trainer's fork server, tools/fork_server.py) at the trajectory's first call and holds what the
trajectory's tools keep between calls (the environment instance, the functions' module state);
it is killed when a call runs past its deadline, and at the trajectory's end. As the reward
worker (rewards/worker.py), it dies with the trainer, leaves Ctrl-C to it and leads a process
group that holds what its tools start, ended with it by a watchdog even when the trainer is
SIGKILLed (core/workers.py).

What crosses the pipe is small and plain: the call's name and JSON arguments going in; text,
already cut to `max_chars`, or a number coming back. A tool returning 20 MB costs the worker
20 MB, never the trainer (which would tokenise it).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

from gspo_cli.core.errors import GspoError
from gspo_cli.core.workers import kill_group_when_gone, kill_groups, pool_worker_init
from gspo_cli.rollout.tool_settings import Side
from gspo_cli.rollout.tools.base import cap_text, result_text
from gspo_cli.rollout.tools.fork_server import fork_server

Op = Literal["call", "make", "reset", "reward"]


@dataclass(frozen=True)
class ToolSetup:
    """What a worker is forked with: the tools (pickled by reference, module and name, as
    load_functions checks) and how to cut their text."""

    functions: Mapping[str, Callable[..., Any]]
    environment_class: type | None
    max_chars: int  # a result's text is cut to this many characters in the worker
    side: Side  # ... keeping its head or its tail


@dataclass(frozen=True)
class Reply:
    """A call's outcome: `text` (cut) and the characters cut from it, or `raised` (the
    exception as "Type: message", its head kept); `number`: get_reward() as a float."""

    text: str = ""
    dropped: int = 0
    raised: bool = False
    number: float | None = None


class ToolProcessGone(Exception):
    """The worker is gone: it ran past the deadline (and was killed) or it exited."""

    def __init__(self, timed_out: bool, exit_code: int | None) -> None:
        super().__init__("timed out" if timed_out else f"exited ({exit_code})")
        self.timed_out = timed_out
        self.exit_code = exit_code


def _raised(exc: BaseException, max_chars: int) -> Reply:
    text, dropped = cap_text(f"{type(exc).__name__}: {exc}".strip(), max_chars, "head")
    return Reply(text, dropped, raised=True)


def _answer(setup: ToolSetup, state: dict[str, Any], op: Op, name: str, kwargs: Any) -> Reply:
    """One request, run in the worker: every exception (SystemExit too) is the reply."""
    try:
        if op == "make":
            assert setup.environment_class is not None
            state["environment"] = setup.environment_class()
            return Reply()
        if op == "reset":  # with the dataset row's fields it names
            state["environment"].reset(**kwargs)
            return Reply()
        if op == "reward":
            value = state["environment"].get_reward()
            try:
                return Reply(repr(value)[:200], number=float(value))
            except (TypeError, ValueError):
                return Reply(repr(value)[:200])
        if name in setup.functions:
            value = setup.functions[name](**kwargs)
        else:
            value = getattr(state["environment"], name)(**kwargs)
        text, dropped = cap_text(result_text(value), setup.max_chars, setup.side)
        return Reply(text, dropped)
    except BaseException as exc:  # in here an exit must not end the worker
        return _raised(exc, setup.max_chars)


def serve(parent_pid: int, setup: ToolSetup, conn: Connection) -> None:
    """The worker's loop (in the fork server's child): one reply per request until EOF."""
    pool_worker_init(parent_pid)  # die with the server (it dies with the trainer), no Ctrl-C,
    # a group of its own
    kill_group_when_gone()  # what a tool starts dies with the worker
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP thread pools do not survive fork: keep torch on one thread
        torch.set_num_threads(1)
    state: dict[str, Any] = {}
    while True:
        try:
            op, name, kwargs = conn.recv()
        except EOFError:  # the trainer closed its end: the trajectory is over
            return
        conn.send(_answer(setup, state, op, name, kwargs))


class ToolWorker:
    """One trajectory's tool process (module docstring), forked at its first request."""

    def __init__(self, setup: ToolSetup) -> None:
        self.setup = setup
        self._pid = 0  # 0: not started, or ended
        self._generation = 0  # the fork server's that forked it
        self._conn: Connection | None = None
        self._closed = False  # closed by its trajectory: no new worker is forked
        self._lock = threading.Lock()  # a close from another thread while a call starts

    def request(self, op: Op, name: str, kwargs: Mapping[str, Any], timeout_s: float) -> Reply:
        """The reply to one request; ToolProcessGone when none came within `timeout_s`
        (the worker is then killed) or the worker died (an exit, a crash in C)."""
        with self._lock:
            if self._closed:
                raise ToolProcessGone(False, None)
            if self._conn is None:
                self._start()
            conn = self._conn
        assert conn is not None
        try:
            conn.send((op, name, dict(kwargs)))
            if conn.poll(timeout_s):
                reply: Reply = conn.recv()
                return reply
            timed_out = True
        except (EOFError, OSError):  # the worker is gone (its end of the pipe closed)
            timed_out = False
        except BaseException:  # Ctrl-C while waiting: the call may never return
            self.close()
            raise
        exit_code = self.close()
        raise ToolProcessGone(timed_out, exit_code)

    def _start(self) -> None:
        try:
            job = pickle.dumps((serve, self.setup))
        except Exception as exc:  # load_functions refuses these; a caller that skipped it
            raise GspoError(
                f"rollout.tools: the tools cannot reach their process ({exc})"
            ) from None
        ours, theirs = mp.Pipe()
        server = fork_server()
        try:
            self._pid = server.fork(job, theirs)
            self._generation = server.generation
        except ConnectionError:
            ours.close()
            raise ToolProcessGone(False, None) from None
        except RuntimeError as exc:  # the server could not import the tools
            raise GspoError(f"rollout.tools: the tools' process failed to start ({exc})") from None
        finally:
            theirs.close()
        self._conn = ours

    def close(self) -> int | None:
        """End the worker and what it started, for good (no later request forks another);
        how it ended (its exit code, negative: the signal's; None when that is unknown)."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            pid, self._pid = self._pid, 0
        if conn is not None:
            conn.close()
        server = fork_server()
        if not pid or server.generation != self._generation:
            return None  # never started, or died with its server (its pid may be another's)
        kill_groups([pid])  # a zombie keeps the status it exited with
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # not yet its group's leader (killed right after the fork)
        try:
            return server.reap(pid)
        except (ConnectionError, RuntimeError):  # the server (and so the worker) is gone
            return None
