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

from gspo_cli.core.workers import become_subreaper, pool_worker_init


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
    server = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker: it serves its pipe until the trainer closes it
        try:
            control.close()
            target(server, setup, Connection(fd))
        finally:
            os._exit(0)
    os.close(fd)
    return pid


def _reap_all(workers: set[int], ended: dict[int, int]) -> None:
    """Reap every child that has ended (a subreaper: the workers' watchdogs come back here
    when their worker dies), keeping a worker's exit code for its `reap`."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in workers:
            ended[pid] = os.waitstatus_to_exitcode(status)


def _reaped(pid: int, workers: set[int], ended: dict[int, int]) -> int:
    """How worker `pid` ended (it was killed, or ended by itself)."""
    workers.discard(pid)
    if pid not in ended:
        try:
            _, status = os.waitpid(pid, 0)
            ended[pid] = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped already, its code not kept: not the tool's exit
            return -9
    return ended.pop(pid)


def _serve_forks(parent_pid: int, control: Connection) -> None:
    pool_worker_init(parent_pid)  # die with the trainer, no Ctrl-C, a group of its own
    become_subreaper()  # orphans of the workers (their watchdogs) are reaped here, not by PID 1
    cache: dict[bytes, Any] = {}  # the jobs it was sent, unpickled (imported) once
    workers: set[int] = set()  # forked, not yet asked for by `reap`
    ended: dict[int, int] = {}  # exit codes of workers reaped before their `reap` came
    while True:
        try:
            op, argument, path = control.recv()
        except EOFError:  # the trainer is done with tools
            return
        _reap_all(workers, ended)
        try:
            if op == "fork":
                sys.path[:] = path  # the trainer's, as it is now (a test adds folders)
                pid = _fork_worker(control, argument, cache)
                workers.add(pid)
                control.send(("ok", pid))
            else:  # "reap": the worker was killed or ended; how it ended
                control.send(("ok", _reaped(argument, workers, ended)))
        except Exception as exc:  # an import the worker needs failed: the trainer says so
            control.send(("error", f"{type(exc).__name__}: {exc}"))


class ForkServer:
    """The trainer's handle on its fork server; started at the first `fork`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one request at a time on the control pipe
        self._control: Connection | None = None
        self._pid = 0
        self.generation = 0  # which server: a worker of an earlier one died with it

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
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve_forks, args=(os.getpid(), theirs))
        try:
            process.start()
        except OSError as exc:  # no process to be had (EAGAIN: the pids limit)
            ours.close()
            raise ConnectionError(f"the tools' fork server cannot start ({exc})") from None
        finally:
            theirs.close()
        self._control, self._pid = ours, process.pid or 0
        self.generation += 1

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
