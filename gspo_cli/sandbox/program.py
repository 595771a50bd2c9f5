"""Run one untrusted program once, in its own sandboxed process, and collect what it did.

Nothing of a run touches the host disk under bwrap and unshare: the spec and the test input
reach the harness (harness/runner.py) as memfds, and the box is a size-limited tmpfs in the
sandbox's own mount namespace, gone with it. The rlimits mode uses a host folder (on /dev/shm
when a memory cgroup counts it), removed by a cleanup that cannot fail. The verdict comes back
on a pipe held only by the harness's trusted checker process. Ending the run, whatever it
started, is sandbox/ending.py's.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import marshal
import os
import secrets
import selectors
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
    checked_mode,
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


STARTUP_GRACE_S = 0.5  # interpreter + wrapper start-up, not charged to the program
STDERR_TAIL = 16 * 1024
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


@dataclass
class RunOutcome:
    """What one run did: its output, the checker's status, and how it ended."""

    stdout: bytes
    stderr_tail: str
    status: dict[str, Any] | None
    returncode: int
    timed_out: bool
    output_limited: bool
    elapsed_s: float
    oom_killed: bool = False

    @property
    def call_result(self) -> str | None:
        result = (self.status or {}).get("result")
        return result if isinstance(result, str) else None

    @property
    def signal(self) -> int | None:
        """The signal that ended the program's process, if any."""
        sig = (self.status or {}).get("signal")
        return sig if isinstance(sig, int) else None


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


def _memfd(name: str, data: bytes) -> int:
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


def run_program(
    code: str,
    *,
    mode: str = "stdio",
    stdin: str = "",
    fn_name: str | None = None,
    check: str | None = None,
    limits: Limits | None = None,
    isolation: str | None = None,
    allow_weak_isolation: bool | None = None,
) -> RunOutcome:
    """Run `code` once: `stdio` feeds `stdin`; `call` calls fn_name with one JSON argument per
    line of `stdin`; `assert` runs the `check` statements against the program.

    Raises WeakIsolationError when only a weak mode is available and not opted into."""
    limits = limits or Limits()
    iso = checked_mode(isolation, allow_weak_isolation)
    precompile_harness()
    nproc = limits.nproc
    with (
        private_uid() as uid,
        run_group(limits.memory_limit_mb, nproc + 4) as group,  # + bwrap, init, checker
        _host_box(iso, uid, group) as host_box,
    ):
        box = box_path(iso, host_box)
        spec = {
            "code": code, "mode": mode, "input": stdin, "fn_name": fn_name,
            "isolation": iso, "weak": iso != "bwrap", "guard": iso != "bwrap", "box": box,
            "uid": uid, "checker_uid": checker_uid(uid), "cpu_s": int(limits.time_limit_s) + 1,
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
        outcome = _launch(spec, check or "", iso, limits, host_box, group)
        if iso == "rlimits" and uid is not None:
            cleanup.remove_owned(SHARED_TMP, uid)
    return outcome


def _launch(
    spec: dict[str, Any],
    check: str,
    iso: str,
    limits: Limits,
    host_box: Path | None,
    group: RunGroup | None,
) -> RunOutcome:
    marker = MARKER_PREFIX + run_prefix() + secrets.token_hex(8)
    spec_fd = _memfd("spec", marshal.dumps(spec))
    stdin_fd = _memfd("stdin", spec["input"].encode())
    check_fd = _memfd("check", check.encode())  # for the checker only, read after the fork
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC) if iso == "bwrap" else (-1, -1)
    argv = _command(iso, limits, info_w, [spec_fd, status_w, check_fd], marker)
    passed = [spec_fd, status_w, check_fd, *spec["cgroup_fds"]]
    passed += [info_w] if info_w >= 0 else []
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=host_box or "/",
            env=_child_env(spec["box"]),
            pass_fds=passed,
            start_new_session=True,  # its own process group
        )
    finally:
        for fd in (spec_fd, stdin_fd, check_fd, status_w, info_w):
            if fd >= 0:
                os.close(fd)
        if group is not None:
            group.close_fds()
    try:
        deadline = start + limits.time_limit_s + STARTUP_GRACE_S
        collected = _collect(proc, status_r, deadline, limits.output_limit_bytes)
    finally:
        end_run(proc, iso, info_r, group, spec["uid"], marker)
        os.close(status_r)
        if info_r >= 0:
            os.close(info_r)
    return _outcome(proc, collected, limits, start, group)


def _command(iso: str, limits: Limits, info_w: int, fds: list[int], marker: str) -> list[str]:
    """The wrapper (bwrap, unshare or none) around the harness, given the spec, status and
    check descriptors (`fds`) and the run's marker."""
    # setpriv --pdeathsig: the wrapper dies with this thread, so a killed trainer leaves no
    # sandbox behind (the harness asks again after it drops privileges).
    argv = [
        *die_with_parent_argv(),
        *wrapper_command(iso, limits.disk_mb, info_w if info_w >= 0 else None),
    ]
    argv += [child_python(), "-I", "-B", "-X", "utf8", runner_path(iso)]
    return [*argv, *map(str, fds), marker]


def _outcome(
    proc: subprocess.Popen[bytes],
    collected: tuple[bytearray, bytearray, bytearray, bool, bool],
    limits: Limits,
    start: float,
    group: RunGroup | None,
) -> RunOutcome:
    """What the ended run did, from what `_collect` read."""
    out, err, status, timed_out, limited = collected
    return RunOutcome(
        stdout=bytes(out[: limits.output_limit_bytes]),
        stderr_tail=err.decode("utf-8", errors="replace"),
        status=_parse_status(status),
        returncode=proc.returncode,
        timed_out=timed_out,
        output_limited=limited,
        elapsed_s=time.monotonic() - start,
        oom_killed=group.oom_killed() if group is not None else False,
    )


def _parse_status(raw: bytes | bytearray) -> dict[str, Any] | None:
    """The checker's status (a dict literal of plain values), or None."""
    try:
        status = ast.literal_eval(raw.decode("utf-8"))
    except (ValueError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError):
        return None
    return status if isinstance(status, dict) else None


def _collect(
    proc: subprocess.Popen[bytes], status_fd: int, deadline: float, cap: int
) -> tuple[bytearray, bytearray, bytearray, bool, bool]:
    """Read stdout, stderr and the status pipe until all close, the deadline passes or the
    output cap is hit. Orphans can hold the pipes open after the run; we stop shortly after
    the wrapper exits."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err, status = bytearray(), bytearray(), bytearray()
    total, exited_at = 0, None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        sel.register(status_fd, selectors.EVENT_READ, status)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return out, err[-STDERR_TAIL:], status, True, False
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:
                break
            for key, _ in sel.select(min(0.05, deadline - now)):
                fd = key.fd
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is status:
                    if len(status) > 2 * cap + 4096:
                        return out, err[-STDERR_TAIL:], bytearray(), False, True
                    continue
                total += len(chunk)
                if total > cap:
                    return out, err[-STDERR_TAIL:], status, False, True
                if len(err) > 2 * STDERR_TAIL:
                    del err[:-STDERR_TAIL]
    return out, err[-STDERR_TAIL:], status, False, False
