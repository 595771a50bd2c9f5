"""Ending a sandboxed run: everything it started is killed, whatever it did.

The pid namespace's init is killed (the kernel then kills everything in it), the run's cgroup
is emptied, and only the rlimits mode without a cgroup still scans /proc (by real uid, or for
the run's marker in argv).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from gspo_cli.sandbox import cleanup
from gspo_cli.sandbox.cgroups import RunGroup


def end_run(
    proc: subprocess.Popen[bytes],
    iso: str,
    info_r: int,
    group: RunGroup | None,
    uid: int | None,
    marker: str,
) -> None:
    """Kill everything the run started, through its pid namespace and its cgroup."""
    if iso == "bwrap":
        if proc.poll() is None:  # else bwrap has reaped its pid 1: that pid may be reused
            _kill_bwrap_init(info_r)
    elif iso == "unshare":
        _signal_group(proc, signal.SIGTERM)  # pid 1 exits on it; the kernel kills the rest
    else:
        _signal_group(proc, signal.SIGKILL)
    if group is not None:
        group.kill()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if iso == "rlimits" and group is None:
        for _ in range(200):  # no namespace, no cgroup: find what escaped the process group
            if not (cleanup.kill_by_uid(uid) if uid is not None else _kill_marked(marker)):
                break
            time.sleep(0.005)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill_bwrap_init(info_r: int) -> None:
    """SIGKILL the sandbox's pid 1 (its pid is on bwrap's info fd); bwrap then exits once the
    kernel has killed the whole pid namespace, so waiting for bwrap waits for all of it."""
    os.set_blocking(info_r, False)
    try:
        info = json.loads(os.read(info_r, 4096) or b"{}")
    except (BlockingIOError, ValueError):
        return
    pid = info.get("child-pid") if isinstance(info, dict) else None
    if isinstance(pid, int) and pid > 1:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _kill_marked(marker: str) -> int:
    """Kill live processes whose argv carries the run's marker; returns how many were found."""
    found = 0
    needle = marker.encode()
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            if needle not in (proc_dir / "cmdline").read_bytes():
                continue
            if (proc_dir / "stat").read_bytes().rsplit(b")", 1)[1][1:2] == b"Z":
                continue
            os.kill(int(proc_dir.name), signal.SIGKILL)
            found += 1
        except (OSError, IndexError):
            continue  # it exited while we looked
    return found
