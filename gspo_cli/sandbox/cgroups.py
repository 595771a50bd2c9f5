"""A memory and pids cgroup per run: the whole run's memory (memfds, tmpfs files and every
forked child included) and its process count are bounded, and every process of the run is
killed through the group.

cgroup v2 needs the memory and pids controllers enabled for the trainer's own cgroup's children
(root of the hierarchy, or a delegated subtree); cgroup v1 needs writable memory (and pids)
hierarchies, as for root. Groups are created under the trainer's own cgroup, so any limit on
the trainer still holds. Where neither works, runs keep per-process rlimits only (RLIMIT_AS
per process, RLIMIT_NPROC), which memfds and shared memory escape; this is said once.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)
ROOT = Path("/sys/fs/cgroup")
PREFIX = "gspo-sbx-"
KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class Layout:
    """Where run groups go: v2 one parent; v1 the memory parent and the pids parent (or None)."""

    version: int
    memory: Path
    pids: Path | None


def own_cgroup_paths() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _writable_group(parent: Path) -> bool:
    probe = parent / f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    _rmdir(probe)
    return True


def _find_layout() -> tuple[Layout | None, str]:
    """(layout, "") or (None, why not)."""
    try:
        paths = own_cgroup_paths()
    except (OSError, ValueError):
        return None, "/proc/self/cgroup is unreadable"
    v2 = ROOT / paths.get("", "/").lstrip("/")
    if (ROOT / "cgroup.controllers").exists() and "" in paths:
        enabled = (v2 / "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled):
            with suppress(OSError):  # allowed at the root or in a delegated, process-free group
                (v2 / "cgroup.subtree_control").write_text("+memory +pids")
            enabled = (v2 / "cgroup.subtree_control").read_text().split()
        if {"memory", "pids"} <= set(enabled) and _writable_group(v2):
            return Layout(2, v2, v2), ""
        return None, f"cgroup v2 group {v2} does not delegate memory and pids to us"
    memory = ROOT / "memory" / paths.get("memory", "/").lstrip("/")
    if "memory" in paths and (memory / "memory.limit_in_bytes").exists():
        if not _writable_group(memory):
            return None, f"cgroup v1 memory group {memory} is not writable"
        pids = ROOT / "pids" / paths.get("pids", "/").lstrip("/")
        return Layout(1, memory, pids if "pids" in paths and _writable_group(pids) else None), ""
    return None, "no cgroup memory controller is mounted"


@cache
def layout() -> Layout | None:
    """The cgroup layout, probed once; warns once when there is none."""
    found, why = _find_layout()
    if found is None:
        log.warning(
            "code sandbox: no memory cgroup (%s); memory is limited per process only "
            "(RLIMIT_AS for each of up to nproc processes; memfds and shared memory not counted)",
            why,
        )
    else:
        _sweep(found)
    return found


def _sweep(found: Layout) -> None:
    """Remove groups left by trainers that died (their pid is in the name)."""
    for parent in {found.memory, found.pids} - {None}:
        assert parent is not None
        for group in parent.glob(f"{PREFIX}*"):
            pid = group.name[len(PREFIX) :].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                _rmdir(group)


def _rmdir(group: Path) -> None:
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.002)  # EBUSY while the last task is being released
    log.warning("code sandbox: could not remove cgroup %s", group)


class RunGroup:
    """One run's cgroup(s): limits set, `fds` open on cgroup.procs for the harness to join."""

    def __init__(self, found: Layout, memory_bytes: int, pids: int) -> None:
        self.layout = found
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self.groups = [found.memory / name]
        if found.version == 1 and found.pids is not None:
            self.groups.append(found.pids / name)
        self.fds: list[int] = []
        try:
            for group in self.groups:
                group.mkdir()
            self._limit(memory_bytes, pids)
            for group in self.groups:
                self.fds.append(os.open(group / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            self.remove()
            raise

    def _limit(self, memory_bytes: int, pids: int) -> None:
        memory = self.groups[0]
        if self.layout.version == 2:
            (memory / "memory.max").write_text(str(memory_bytes))
            (memory / "pids.max").write_text(str(pids))
            with suppress(OSError):
                (memory / "memory.swap.max").write_text("0")
            return
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        with suppress(OSError):  # absent without swap accounting
            (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        if len(self.groups) > 1:
            (self.groups[1] / "pids.max").write_text(str(pids))

    def close_fds(self) -> None:
        for fd in self.fds:
            with suppress(OSError):
                os.close(fd)
        self.fds = []

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.groups[0] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """SIGKILL every process in the group until it is empty (new forks are caught too)."""
        if self.layout.version == 2:
            with suppress(OSError):
                (self.groups[0] / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + KILL_WAIT_S
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def oom_killed(self) -> bool:
        """True when the kernel's OOM killer ended a process of this run."""
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        try:
            for line in (self.groups[0] / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        except (OSError, ValueError):
            pass
        return False

    def remove(self) -> None:
        self.close_fds()
        for group in self.groups:
            _rmdir(group)


@contextmanager
def run_group(memory_mb: int, pids: int) -> Iterator[RunGroup | None]:
    """A fresh group for one run (None where cgroups are unavailable); killed and removed."""
    found = layout()
    if found is None:
        yield None
        return
    group = RunGroup(found, memory_mb * 1024 * 1024, pids)
    try:
        yield group
    finally:
        group.kill()
        group.remove()
