"""Cleanup after a run that must never fail, whatever the program left behind.

`remove_tree` deletes a folder of any depth without recursion (a chain of thousands of nested
folders made shutil.rmtree fail), holding one directory descriptor at a time and never
following a symlink. `kill_by_uid` and `remove_owned` serve the rlimits mode, which has no pid
namespace: they match the real, effective and saved uid, so a setuid helper is found too.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
from contextlib import suppress
from pathlib import Path

log = logging.getLogger(__name__)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_STEPS = 10_000_000  # a budget, in case something refuses to be removed


def remove_tree(root: str | Path) -> None:
    """Remove `root` and everything under it; errors are skipped, never raised."""
    try:
        _remove_tree(str(root))
    except OSError as exc:
        log.warning("code sandbox: could not fully remove %s: %s", root, exc)


def _remove_tree(root: str) -> None:
    try:
        fd = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError:
        with suppress(OSError):
            os.unlink(root)  # not a folder (or a symlink to one)
        return
    names: list[str] = []  # path from root to the folder `fd` is open on
    stuck: set[tuple[int, int]] = set()  # folders that could not be emptied
    try:
        for _ in range(MAX_STEPS):
            child = _first_subfolder(fd, stuck)
            if child is not None:
                name, child_fd = child
                os.close(fd)
                fd, names = child_fd, [*names, name]
                continue
            if not names:
                break
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            here = os.fstat(fd)
            os.close(fd)
            fd, name = parent, names.pop()
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError:
                stuck.add((here.st_dev, here.st_ino))
    finally:
        os.close(fd)
    with suppress(OSError):
        os.rmdir(root)


def _first_subfolder(fd: int, stuck: set[tuple[int, int]]) -> tuple[str, int] | None:
    """Unlink the files in the folder open on `fd`; return its first subfolder, opened."""
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                with suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
                continue
            if (info.st_dev, info.st_ino) in stuck:
                continue
            with suppress(OSError):
                os.chmod(entry.name, stat.S_IRWXU, dir_fd=fd)  # a program's chmod 000
            try:
                return entry.name, os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                stuck.add((info.st_dev, info.st_ino))
    return None


def _uids(pid_dir: Path) -> set[int]:
    """Real, effective, saved and filesystem uids of a live process (empty once it is gone)."""
    try:
        for line in (pid_dir / "status").read_text().splitlines():
            if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                return set()
            if line.startswith("Uid:"):
                return {int(u) for u in line.split()[1:]}
    except (OSError, ValueError, IndexError):
        pass
    return set()


def kill_by_uid(uid: int) -> int:
    """SIGKILL every process any of whose uids is `uid`; returns how many were found."""
    found = 0
    for pid_dir in Path("/proc").iterdir():
        if pid_dir.name.isdigit() and uid in _uids(pid_dir):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid_dir.name), signal.SIGKILL)
                found += 1
    return found


def remove_owned(folders: tuple[str, ...], uid: int) -> None:
    """Remove the top-level entries of shared folders (/dev/shm, /tmp) that `uid` owns."""
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            with suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    remove_tree(entry.path)
