"""The worker threads that run sandboxed programs in parallel: the code reward's judge and the
interpreter tool share one pool per process."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class SandboxPool:
    """Worker threads, each supervising one sandboxed process at a time."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or max(1, os.cpu_count() or 1)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="gspo-sandbox")

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """fn over items in parallel, results in order."""
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


_default_pool: SandboxPool | None = None


def default_pool() -> SandboxPool:
    """The shared pool (created on first use, closed at exit)."""
    global _default_pool
    if _default_pool is None:
        _default_pool = SandboxPool()
        atexit.register(_default_pool.close)
    return _default_pool
