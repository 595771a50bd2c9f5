"""Starting one sandboxed run: its box (private uid, cgroup, host folder), the spec the harness
reads, and the wrapper process (bwrap, unshare or none) around the harness. A program run
(program.py) and an interpreter session (session.py) start the same way.

Nothing of a run touches the host disk under bwrap and unshare: the spec and the test input
reach the harness (harness/runner.py) as memfds, and the box is a size-limited tmpfs in the
sandbox's own mount namespace, gone with it. The rlimits mode uses a host folder (on /dev/shm
when a memory cgroup counts it), removed by a cleanup that cannot fail. Ending the run, whatever
it started, is sandbox/ending.py's.
"""

from __future__ import annotations

import contextlib
import importlib
import marshal
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gspo_cli.core.workers import die_with_parent_argv
from gspo_cli.sandbox import cleanup
from gspo_cli.sandbox.cgroups import RunGroup, run_group
from gspo_cli.sandbox.ending import end_run
from gspo_cli.sandbox.isolation import (
    box_path,
    checker_uid,
    child_python,
    precompile_harness,
    private_uid,
    python_prefix,
    runner_path,
    wrapper_command,
)

MARKER_PREFIX = "gspo-sandbox-run-"  # in every sandboxed process's argv, for cleanup and tests


def run_prefix() -> str:
    """Start of this process's run markers and host folders (other trainers have their own)."""
    return f"{os.getpid()}-"


READ_ROOTS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/share", "/lib", "/lib64")
SHARED_TMP = ("/dev/shm", "/tmp", "/var/tmp")
# LeetCode-style names programs use without importing them (LiveCodeBench's header).
STAR_IMPORTS = ("typing", "collections", "heapq", "bisect", "itertools", "functools")
MODULE_IMPORTS = (
    "math", "heapq", "bisect", "collections", "itertools", "functools", "string", "re", "random",
    "sys",
)  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """Per-run limits. Memory and nproc bound the whole run where a cgroup is available (else
    each process); disk_mb is the size of the box's tmpfs."""

    time_limit_s: float = 6.0
    memory_limit_mb: int = 1024
    output_limit_bytes: int = 8 * 1024 * 1024
    file_size_mb: int = 16
    open_files: int = 64
    nproc: int = 16
    disk_mb: int = 64


@cache
def header_names() -> dict[str, tuple[str, str]]:
    """name -> (module, attribute; "" for the module itself), in star-import order."""
    names: dict[str, tuple[str, str]] = {}
    for module_name in STAR_IMPORTS:
        module = importlib.import_module(module_name)
        public = getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")])
        names.update({name: (module_name, name) for name in public})
    names.update({name: (name, "") for name in MODULE_IMPORTS})
    return names


def _child_env(box: str) -> dict[str, str]:
    """Nothing from the trainer's environment (tokens, keys, proxies) reaches the program."""
    path = "/usr/local/bin:/usr/bin:/bin"
    return {"PATH": path, "HOME": box, "TMPDIR": box, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _user_task_count() -> int:
    """The tasks our uid runs: RLIMIT_NPROC counts every thread of the uid, not processes, so
    a trainer with many threads (torch's, a tokenizer's) must count them all."""
    uid = os.getuid()
    total = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _owner(proc) == uid:
            with contextlib.suppress(OSError):  # a process that ended meanwhile
                total += len(os.listdir(proc / "task"))
    return total


def _owner(proc_dir: Path) -> int | None:
    try:
        return proc_dir.stat().st_uid
    except OSError:
        return None


def memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@contextlib.contextmanager
def _host_box(mode: str, uid: int | None, group: RunGroup | None) -> Iterator[Path | None]:
    """rlimits only: the run's folder on the host (on /dev/shm when a cgroup counts its pages)."""
    if mode != "rlimits":
        yield None
        return
    parent = "/dev/shm" if group is not None and os.access("/dev/shm", os.W_OK) else None
    prefix = f"gspo-sbx-{run_prefix()}"
    box = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or tempfile.gettempdir()))
    try:
        if uid is not None:
            os.chown(box, uid, uid)
        yield box
    finally:
        cleanup.remove_tree(box)


@dataclass
class Box:
    """Where one sandboxed run lives: its isolation mode, private uid, cgroup and (rlimits
    only) host folder, held until the run ends."""

    iso: str
    uid: int | None
    group: RunGroup | None
    host_box: Path | None

    @property
    def path(self) -> str:
        return box_path(self.iso, self.host_box)


def enter_box(stack: contextlib.ExitStack, iso: str, limits: Limits) -> Box:
    """The run's uid, cgroup and host folder, released by `stack` (the rlimits mode's files
    of the run's uid in the shared temp folders too)."""
    precompile_harness()
    uid = stack.enter_context(private_uid())
    group = stack.enter_context(run_group(limits.memory_limit_mb, limits.nproc + 4))  # + init..
    host_box = stack.enter_context(_host_box(iso, uid, group))
    if iso == "rlimits" and uid is not None:
        stack.callback(cleanup.remove_owned, SHARED_TMP, uid)
    return Box(iso, uid, group, host_box)


def run_spec(
    box: Box,
    code: str,
    mode: str,
    limits: Limits,
    *,
    stdin: str = "",
    fn_name: str | None = None,
    cpu_s: int | None = None,
) -> dict[str, Any]:
    """What the harness is told: the program, its mode and every limit (`cpu_s`: its CPU
    time in all, by default the time limit's)."""
    iso, uid, group = box.iso, box.uid, box.group
    nproc = limits.nproc
    return {
        "code": code, "mode": mode, "input": stdin, "fn_name": fn_name,
        "isolation": iso, "weak": iso != "bwrap", "guard": iso != "bwrap", "box": box.path,
        "uid": uid, "checker_uid": checker_uid(uid),
        "cpu_s": cpu_s if cpu_s is not None else int(limits.time_limit_s) + 1,
        "memory_mb": limits.memory_limit_mb, "file_mb": limits.file_size_mb,
        "open_files": limits.open_files, "disk_mb": limits.disk_mb,
        "nproc": nproc if uid is not None else _user_task_count() + nproc,
        "read_roots": [python_prefix(child_python()), *READ_ROOTS],
        "cgroup_fds": group.fds if group else [], "header": header_names(),
        "message_limit": limits.output_limit_bytes,
        # Without a pid namespace the harness checks it still has this parent (kernel.py);
        # inside one its parent is the namespace's init, which dies with the wrapper.
        "parent_pid": os.getpid() if iso == "rlimits" else None,
    }  # fmt: skip


@dataclass
class Started:
    """A sandboxed run under way: its wrapper process and the pipes only the caller reads."""

    proc: subprocess.Popen[bytes]
    status_r: int  # the checker's status, or the session's end
    info_r: int  # bwrap's child pid (-1 otherwise)
    box: Box
    marker: str
    start: float
    extra: list[int]  # more of the caller's descriptors, closed at the end

    def end(self) -> None:
        """Kill everything the run started and close its pipes."""
        try:
            end_run(self.proc, self.box.iso, self.info_r, self.box.group, self.box.uid, self.marker)
        finally:
            for fd in (self.status_r, self.info_r, *self.extra):
                if fd >= 0:
                    os.close(fd)


def start_run(
    box: Box, spec: dict[str, Any], stdin_fd: int, check: str, pass_fds: tuple[int, ...] = ()
) -> Started:
    """Start the harness on `spec` (stdin from `stdin_fd`, closed here; `pass_fds` also reach
    it and are closed here)."""
    marker = MARKER_PREFIX + run_prefix() + secrets.token_hex(8)
    spec_fd = memfd("spec", marshal.dumps(spec))
    check_fd = memfd("check", check.encode())  # for the checker only, read after the fork
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC) if box.iso == "bwrap" else (-1, -1)
    argv = _command(box.iso, spec["disk_mb"], info_w, [spec_fd, status_w, check_fd], marker)
    passed = [spec_fd, status_w, check_fd, *spec["cgroup_fds"], *pass_fds]
    passed += [info_w] if info_w >= 0 else []
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=box.host_box or "/",
            env=_child_env(spec["box"]),
            pass_fds=passed,
            start_new_session=True,  # its own process group
        )
    except BaseException:
        for fd in (status_r, info_r):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (spec_fd, stdin_fd, check_fd, status_w, info_w, *pass_fds):
            if fd >= 0:
                os.close(fd)
        if box.group is not None:
            box.group.close_fds()
    return Started(proc, status_r, info_r, box, marker, start, [])


def _command(iso: str, disk_mb: int, info_w: int, fds: list[int], marker: str) -> list[str]:
    """The wrapper (bwrap, unshare or none) around the harness, given the spec, status and
    check descriptors (`fds`) and the run's marker."""
    # setpriv --pdeathsig: the wrapper dies with this thread, so a killed trainer leaves no
    # sandbox behind (the harness asks again after it drops privileges).
    argv = [
        *die_with_parent_argv(),
        *wrapper_command(iso, disk_mb, info_w if info_w >= 0 else None),
    ]
    argv += [child_python(), "-I", "-B", "-X", "utf8", runner_path(iso)]
    return [*argv, *map(str, fds), marker]
