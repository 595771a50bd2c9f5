"""One writer per folder: `one_writer` holds a run or eval folder's lock while a command
writes it, and refuses a second writer with one line naming the holder.

The lock is the kernel's (flock on the folder's LOCK file), which it drops when the holder dies
however it dies, SIGKILL included: a killed run's lock never blocks its resume.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import LOCK, write_error

# Lock files this process holds (descriptors). A forked child (a maths verifier worker) closes
# its copies: else it would keep a SIGKILLed trainer's lock alive until it died too.
_HELD_LOCKS: set[int] = set()
# How long a refused writer waits for the holder's pid and host to be written (it locks first).
HOLDER_WAIT_S = 1.0


def _close_held_locks() -> None:
    for fd in _HELD_LOCKS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_close_held_locks)


@contextlib.contextmanager
def one_writer(folder: Path, command: str) -> Iterator[None]:
    """Hold `folder`'s lock (created with the folder if need be) while the block runs.

    A second writer (any command, with or without --resume) gets one line naming the holder.
    The lock is the kernel's (flock on LOCK), which it drops when the holder dies however it
    dies, SIGKILL included: a lock a killed run left never blocks its resume. The file only
    says who holds it (pid, host, command) and is removed on release."""
    if folder.exists() and not folder.is_dir():
        raise GspoError(f"{folder} is a file, not a folder: choose another --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _take_lock(folder, command)
    except OSError as exc:
        raise write_error(exc, folder) from None
    _HELD_LOCKS.add(fd)
    try:
        yield
    finally:
        _HELD_LOCKS.discard(fd)
        with contextlib.suppress(OSError):
            (folder / LOCK).unlink()  # before unlocking: see _take_lock
        os.close(fd)


def _take_lock(folder: Path, command: str) -> int:
    """The locked descriptor of `folder`/LOCK, with this process written in it; GspoError
    naming the holder when another process has it."""
    path = folder / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # no O_TRUNC: the holder's record
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise GspoError(
                f"{folder} is in use by {_holder(path)}: wait for it to end, or choose "
                "another --out"
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # a holder removed this file as it released it: lock the new one
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command}
    record["since"] = time.strftime("%Y-%m-%d %H:%M:%S")
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(record).encode("utf-8"))
    return fd


def _holder(path: Path) -> str:
    """Who holds the lock at `path`, from its record: 'gspo train (pid 12, host h, since ...)'.
    The holder writes it just after locking, so an empty record is waited for, briefly."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return (
                f"{record['command']} (pid {record['pid']} on host {record['host']}, "
                f"since {record['since']})"
            )
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "another process (its pid and host are unknown)"
            time.sleep(0.05)
