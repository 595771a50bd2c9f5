"""Users' reward functions run in a worker process, so that a hanging call can be stopped.

A thread cannot be stopped, and a signal cannot interrupt C code that holds the GIL (a regular
expression backtracking for ever): only a process can be killed. The worker is forked (not
spawned: spawn re-imports the caller's __main__) at the first call and kept, so a function's
module state lives on between calls, in the worker. The functions reach the worker through
fork's copy of memory: only completions, columns and scores are pickled, so a lambda or a
closure is a fine reward. The worker dies with the trainer and leaves Ctrl-C to it
(gspo_cli/core/workers.py); it leads a process group, which holds what the functions start (a
`sleep`, a server) and is killed with it: after a timeout, at the run's end, and by a watchdog
when the trainer is SIGKILLed; it runs functions in its main thread, so Math-Verify's signal-based
timeouts work inside a user's reward.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from gspo_cli.core.workers import (
    kill_group_when_gone,
    kill_groups,
    kill_pool,
    pool_pids,
    pool_worker_init,
)
from gspo_cli.rewards.contract import RewardFailure, RewardTimeout, describe_exception


@dataclass(frozen=True)
class WorkerFunction:
    fn: Callable[..., Any]
    home: str | None  # the function's source file, to point an error at its own line


HEARTBEAT_S = 30.0  # a call still running says so this often: no silent waits

_FUNCTIONS: Sequence[WorkerFunction] = ()  # in the worker: what it was forked with


@dataclass(frozen=True)
class _Raised:
    description: str


def _init(parent_pid: int, functions: Sequence[WorkerFunction]) -> None:
    global _FUNCTIONS
    pool_worker_init(parent_pid)
    kill_group_when_gone()  # what a reward starts dies with the worker, even a SIGKILLed one
    _FUNCTIONS = functions
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP thread pools do not survive fork: keep torch on one thread
        torch.set_num_threads(1)


def _run(index: int, args: list[Any], kwargs: dict[str, Any]) -> Any:
    function = _FUNCTIONS[index]
    try:
        result = function.fn(*args, **kwargs)
    except BaseException as exc:  # SystemExit too: in here it must not end the worker
        return _Raised(describe_exception(exc, function.home))
    if hasattr(result, "tolist") and not isinstance(result, list | tuple):
        return result.tolist()  # arrays and tensors travel as Python numbers
    if result is None or isinstance(result, list | tuple):
        return result
    return _Raised(f"returned a {type(result).__name__}, not a list of scores")


def _wait(
    future: Future[Any], timeout_s: float, still_running: Callable[[float], None] | None
) -> Any:
    """The call's result, saying every HEARTBEAT_S that it still runs; FutureTimeout past
    `timeout_s`."""
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= timeout_s:
            raise FutureTimeout
        try:
            return future.result(timeout=min(timeout_s - elapsed, HEARTBEAT_S))
        except FutureTimeout:
            elapsed = time.monotonic() - started
            if elapsed < timeout_s and still_running is not None:
                still_running(elapsed)


class RewardWorker:
    """One process that calls `functions[index]` with a deadline (`call`)."""

    def __init__(self, functions: Sequence[WorkerFunction]) -> None:
        self.functions = tuple(functions)
        self._pool: ProcessPoolExecutor | None = None

    def call(
        self,
        index: int,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: float,
        still_running: Callable[[float], None] | None = None,
    ) -> Any:
        """What `functions[index]` returned, or RewardFailure (it raised, hung or died);
        `still_running(seconds)` every HEARTBEAT_S while it runs."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=mp.get_context("fork"),
                initializer=_init,
                initargs=(os.getpid(), self.functions),  # fork: not pickled
            )
        try:
            future = self._pool.submit(_run, index, args, kwargs)
            result = _wait(future, timeout_s, still_running)
        except FutureTimeout:
            self._kill()
            raise RewardTimeout(f"no result within {timeout_s:g}s") from None
        except BrokenProcessPool:
            self._kill()
            raise RewardFailure("its worker process died (killed, or a crash in C code)") from None
        except Exception as exc:  # e.g. a column or a score that cannot be pickled
            self._kill()
            raise RewardFailure(
                f"could not pass through its worker: {describe_exception(exc)}"
            ) from None
        except BaseException:  # a stop signal while waiting: the call may never return
            self._kill()
            raise
        if isinstance(result, _Raised):
            raise RewardFailure(result.description)
        return result

    def _kill(self) -> None:
        if self._pool is not None:
            kill_pool(self._pool, groups=True)  # a hung call ignores shutdown
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            pids = pool_pids(self._pool)
            self._pool.shutdown(wait=True, cancel_futures=True)
            kill_groups(pids)  # what the functions started and left running
            self._pool = None
