"""Child processes that never outlive the trainer.

A SIGKILLed (or OOM-killed) trainer runs no cleanup, so its children must arrange their own end:
each one asks the Linux kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`). Pool workers
also leave the trainer's process group (and ignore SIGINT): a signal sent to that whole group
(Ctrl-C in a terminal, torchrun's SIGTERM or SIGINT to each rank's group, `kill -- -PGID`)
reaches only the trainer, which stops at its own pace (train/run/signals.py) and shuts its pools
down cleanly, with no worker tracebacks and no pool broken in the middle of a step. SIGTERM
keeps its default action, on which the pool relies to end the workers of a broken pool.

The kernel's "parent" is the *thread* that created the child: pools must be started from a thread
that lives as long as they do (the main thread, in gspo).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
# Set in a worker's environment (its host and pid): what the worker starts with exec (a
# subprocess) inherits it, in any session or process group, so `kill_tagged` finds it after the
# group is gone (unless it cleared its environment). The host keeps two machines' pids apart.
WORKER_TAG = "GSPO_WORKER"


def become_subreaper() -> None:
    """Orphans among this process's descendants come back to it, not to PID 1 (which, in a
    container without an init, never reaps them); it must reap them."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), zero, zero, zero)


def die_with_parent(parent_pid: int) -> bool:
    """Ask for SIGKILL when the parent dies; False where the kernel offers no such thing.

    A parent that died before the request was made sends nothing: then this process ends now.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), zero, zero, zero) != 0:
        return False
    if os.getppid() != parent_pid:  # orphaned already, between fork and prctl
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def pool_worker_init(parent_pid: int) -> None:
    """`initializer` of a worker pool: die with the parent, leave group signals to the parent.

    A forked worker inherits the trainer's signal handlers; SIGTERM goes back to the default
    (end at once), as the trainer's stop-at-the-next-step handler means nothing here.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setpgid(0, 0)  # a group of its own: see the module's docstring
    die_with_parent(parent_pid)


def worker_tag(pid: int) -> str:
    """The value of WORKER_TAG for worker `pid` on this host."""
    return f"{socket.gethostname()}:{pid}"


def tag_descendants() -> None:
    """Mark what this worker will start (WORKER_TAG, see above)."""
    os.environ[WORKER_TAG] = worker_tag(os.getpid())


def kill_tagged(worker_pid: int) -> int:
    """SIGKILL every process whose environment carries `worker_pid`'s tag (tag_descendants):
    what the worker started with exec, even in a session of its own (`setsid`,
    start_new_session) and re-parented to init. How many were found. (A process forked
    without exec shows its parent's first environment in /proc, not the tag: it stays in the
    worker's process group unless it leaves it.)"""
    tag = f"{WORKER_TAG}={worker_tag(worker_pid)}".encode()
    found = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as file:
                environ = file.read().split(b"\0")
        except OSError:  # ended, or another user's
            continue
        if tag in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                found += 1
    return found


def kill_group_when_gone(tag: bool = True) -> None:
    """Fork a watchdog that SIGKILLs this process's whole group (itself included) once this
    process has ended, however it ended: SIGKILLed with the trainer, killed after a timeout, or
    at a clean exit. What a user's code started (a `sleep`, a server) stays in the group, unless
    it left it (`setsid`), and is re-parented to init when its parent dies: only a process
    outside it can still end it. Call it in a process that leads its group (`os.setpgid(0, 0)`),
    from the thread that lives as long as the process (the watchdog's "parent", as above).
    What left the group is found by its environment's tag (`kill_tagged`)."""
    leader = os.getpid()
    if tag:  # a worker's, not a launcher's (whose environment its ranks on other hosts share)
        tag_descendants()
    if os.fork() != 0:
        return
    try:  # the watchdog: wait for the leader's end, then end the group
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # kept for sigwait
        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGUSR1), zero, zero, zero)
        if os.getppid() == leader:  # else gone already, between fork and prctl
            signal.sigwait({signal.SIGUSR1})
        if tag:  # what left the group (a new session) first: the tag outlives it
            kill_tagged(leader)
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)  # never back into the caller's code


def die_with_parent_argv() -> list[str]:
    """An argv prefix that makes an exec'd child die with the calling thread (util-linux
    `setpriv --pdeathsig`, which survives exec); [] where setpriv is missing."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [] if setpriv is None else [setpriv, "--pdeathsig", "KILL", "--"]


def pool_pids(pool: ProcessPoolExecutor) -> list[int]:
    """The pool's worker processes (its own `_processes`; no public handle exists)."""
    return list((getattr(pool, "_processes", None) or {}).keys())


def kill_groups(pids: list[int]) -> None:
    """SIGKILL the process groups these processes lead (`pool_worker_init` made each one),
    and what they started outside them (`kill_tagged`)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already
            os.killpg(pid, signal.SIGKILL)
        kill_tagged(pid)


def kill_pool(pool: ProcessPoolExecutor, groups: bool = False) -> None:
    """End a pool now, busy workers included (with `groups`, their process groups too): a hung
    task ignores `shutdown`, so its worker is killed first."""
    if groups:
        kill_groups(pool_pids(pool))
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
