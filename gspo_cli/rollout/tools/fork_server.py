"""The small process that forks each trajectory's tool worker (tools/worker.py).

Forking the trainer itself costs what its memory costs: 65 ms for a fork and exit of a process
holding 1 GiB on this machine, more with a real model's weights and optimizer state, per
trajectory. So each trainer process spawns one fresh interpreter at its first tool call, which
imports only the tools, and that process forks the workers (about a millisecond each). The tools
reach it pickled by reference (module and name, checked at load time), with the trainer's
import path; each worker's end of its pipe is passed over the control pipe (SCM_RIGHTS), so the
trainer then speaks to the worker directly.

The server dies with the trainer and leaves Ctrl-C to it (core/workers.py); its workers die with
it. It reaps its workers and reports how each ended (`reap`).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

from gspo_cli.core.workers import pool_worker_init


def _fork_worker(control: Connection, job_bytes: bytes, cache: dict[bytes, Any]) -> int:
    """Fork one worker that runs the pickled job `(target, setup)` as `target(server pid,
    setup, pipe end)` on the pipe end that follows on `control`; its pid."""
    fd = recv_handle(control)
    try:
        if job_bytes not in cache:  # unpickling imports the tools: once per setup
            cache[job_bytes] = pickle.loads(job_bytes)
    except BaseException:
        os.close(fd)
        raise
    target, setup = cache[job_bytes]
    pid = os.fork()
    if pid == 0:  # the worker: it serves its pipe until the trainer closes it
        try:
            control.close()
            target(os.getppid(), setup, Connection(fd))
        finally:
            os._exit(0)
    os.close(fd)
    return pid


def _serve_forks(parent_pid: int, control: Connection) -> None:
    pool_worker_init(parent_pid)  # die with the trainer, no Ctrl-C, a group of its own
    cache: dict[bytes, Any] = {}  # the jobs it was sent, unpickled (imported) once
    while True:
        try:
            op, argument, path = control.recv()
        except EOFError:  # the trainer is done with tools
            return
        try:
            if op == "fork":
                sys.path[:] = path  # the trainer's, as it is now (a test adds folders)
                control.send(("ok", _fork_worker(control, argument, cache)))
            else:  # "reap": the worker was killed or ended; how it ended
                _, status = os.waitpid(argument, 0)
                control.send(("ok", os.waitstatus_to_exitcode(status)))
        except Exception as exc:  # an import the worker needs failed: the trainer says so
            control.send(("error", f"{type(exc).__name__}: {exc}"))


class ForkServer:
    """The trainer's handle on its fork server; started at the first `fork`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one request at a time on the control pipe
        self._control: Connection | None = None
        self._pid = 0

    def _request(self, op: str, argument: Any, handle: int | None = None) -> Any:
        """The server's answer; ConnectionError when the server is gone (the next request
        starts a new one), RuntimeError with the server's one line when it failed."""
        if self._control is None:
            self._start()
        assert self._control is not None
        try:
            self._control.send((op, argument, list(sys.path)))
            if handle is not None:
                send_handle(self._control, handle, self._pid)
            status, value = self._control.recv()
        except (EOFError, OSError) as exc:  # killed (the OOM killer?) or never started
            self.close()
            raise ConnectionError(f"the tools' fork server is gone ({exc!r})") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        """Close the control pipe: the server returns, and its workers die with it."""
        if self._control is not None:
            self._control.close()
            self._control = None

    def _start(self) -> None:
        context = mp.get_context("spawn")  # a fresh interpreter: small to fork
        self._control, theirs = context.Pipe()
        process = context.Process(target=_serve_forks, args=(os.getpid(), theirs))
        process.start()
        theirs.close()
        self._pid = process.pid or 0

    def fork(self, job_bytes: bytes, worker_end: Connection) -> int:
        """A new worker serving `worker_end` (`job_bytes`: a pickled `(target, setup)`, see
        `_fork_worker`); its pid."""
        with self._lock:
            pid: int = self._request("fork", job_bytes, worker_end.fileno())
            return pid

    def reap(self, pid: int) -> int:
        """How worker `pid` ended (its exit code; negative: the signal), once it has."""
        with self._lock:
            code: int = self._request("reap", pid)
            return code


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()


def fork_server() -> ForkServer:
    """This process's fork server (one per trainer process: each rank, the async worker)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = ForkServer()
        return _SERVER


@atexit.register
def _close_server() -> None:
    """Before multiprocessing joins its children at exit (its handler was registered first,
    by multiprocessing.connection above, so it runs after this one): the server must end."""
    if _SERVER is not None:
        _SERVER.close()
