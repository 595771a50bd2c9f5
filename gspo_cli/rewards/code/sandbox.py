"""Run one untrusted program once, in its own sandboxed process, and collect what it did.

Each run gets a fresh temporary folder (removed afterwards) with two parts: `box`, the only
place the program may write, and `judge`, where the harness, its spec and the test input live.
The process runs in a new session (its own process group) with a scrubbed environment; the
harness (runner.py) sets the rlimits and drops root. Whatever happens, the group, the run's
private uid and every process carrying the run's marker are killed before the call returns.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.rewards.code.isolation import (
    child_python,
    detect_mode,
    paths_in_sandbox,
    private_uid,
    python_prefix,
    wrapper_command,
)
from gspo_cli.workers import die_with_parent_argv

RUNNER = Path(__file__).with_name("runner.py")
MARKER_PREFIX = "gspo-sandbox-run-"  # in every sandboxed process's argv, for cleanup and tests
STARTUP_GRACE_S = 0.5  # interpreter + wrapper start-up, not charged to the program
STDERR_TAIL = 16 * 1024
READ_ROOTS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/share", "/lib", "/lib64")


@dataclass(frozen=True)
class Limits:
    """Per-run limits. nproc counts threads too; it is per private uid when run as root."""

    time_limit_s: float = 6.0
    memory_limit_mb: int = 1024
    output_limit_bytes: int = 8 * 1024 * 1024
    file_size_mb: int = 16
    open_files: int = 64
    nproc: int = 16


@dataclass
class RunOutcome:
    """What one run did: its output, the harness's status line, and how it ended."""

    stdout: bytes
    stderr_tail: str
    status: dict[str, Any] | None
    returncode: int
    timed_out: bool
    output_limited: bool
    elapsed_s: float
    call_result: str | None = None

    @property
    def signal(self) -> int | None:
        """The signal that ended the program (wrappers report 128+n), if any."""
        if self.returncode < 0:
            return -self.returncode
        return self.returncode - 128 if 128 < self.returncode < 160 else None


def _child_env(box: str) -> dict[str, str]:
    """Nothing from the trainer's environment (tokens, keys, proxies) reaches the program."""
    path = "/usr/local/bin:/usr/bin:/bin"
    return {"PATH": path, "HOME": box, "TMPDIR": box, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid)


def _owner(proc_dir: Path) -> int | None:
    try:
        return proc_dir.stat().st_uid
    except OSError:
        return None


def _rmtree(path: Path) -> None:
    """Remove a run's tree, even where the program chmod-ed its own folders to 000.

    Root needs no help; others restore owner access top-down first, never through symlinks
    (a link to /etc must not be chmod-ed). Every process of the run is dead by now.
    """
    if os.getuid() != 0:
        for dirpath, dirnames, _ in os.walk(path):
            for name in dirnames:
                child = os.path.join(dirpath, name)
                if not os.path.islink(child):
                    with suppress(OSError):
                        os.chmod(child, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _workspace(uid: int | None) -> Iterator[tuple[Path, Path]]:
    root = Path(tempfile.mkdtemp(prefix="gspo-sbx-"))
    try:
        box, judge = root / "box", root / "judge"
        box.mkdir(mode=0o700)
        judge.mkdir(mode=0o700)
        if uid is not None:
            os.chown(box, uid, uid)
        yield box, judge
    finally:
        _rmtree(root)


def _spec(code: str, mode: str, limits: Limits, uid: int | None, **extra: Any) -> dict[str, Any]:
    nproc = limits.nproc if uid is not None else _user_process_count() + limits.nproc
    return {
        "code": code,
        "mode": mode,
        "nonce": secrets.token_hex(16),
        "uid": uid,
        "cpu_s": int(limits.time_limit_s) + 1,
        "memory_mb": limits.memory_limit_mb,
        "file_mb": limits.file_size_mb,
        "open_files": limits.open_files,
        "nproc": nproc,
        "read_roots": [python_prefix(child_python()), *READ_ROOTS],
        "parent_pid": os.getpid(),
        **extra,
    }


def run_program(
    code: str,
    *,
    mode: str = "stdio",
    stdin: str = "",
    fn_name: str | None = None,
    check: str | None = None,
    limits: Limits | None = None,
    isolation: str | None = None,
) -> RunOutcome:
    """Run `code` once: `stdio` feeds `stdin`; `call` calls fn_name with one JSON argument per
    line of `stdin`; `assert` runs the `check` statements after the program."""
    limits = limits or Limits()
    iso = isolation or detect_mode()
    marker = MARKER_PREFIX + secrets.token_hex(8)
    with private_uid() as uid, _workspace(uid) as (box, judge):
        spec = _spec(code, mode, limits, uid, input=stdin, fn_name=fn_name, check=check)
        spec["guard"] = iso != "bwrap"  # bwrap's mount namespace already hides the host
        (judge / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        shutil.copyfile(RUNNER, judge / "runner.py")
        (judge / "stdin").write_text(stdin, encoding="utf-8")
        box_in, judge_in = paths_in_sandbox(iso, box, judge)
        # The wrapper (or the harness itself) dies with this thread: a killed trainer leaves no
        # program running; the harness re-arms that after it drops privileges.
        argv = [*die_with_parent_argv(), *wrapper_command(iso, box, judge)]
        argv += [child_python(), "-I", "-B", "-X", "utf8"]
        argv += [f"{judge_in}/runner.py", f"{judge_in}/spec.json", marker]
        outcome = _supervise(argv, box, box_in, judge / "stdin", limits, uid, marker)
    return _with_status(outcome, spec["nonce"])


def _supervise(
    argv: list[str],
    box: Path,
    box_in: str,
    stdin_path: Path,
    limits: Limits,
    uid: int | None,
    marker: str,
) -> RunOutcome:
    start = time.monotonic()
    with open(stdin_path, "rb") as stdin_file:
        proc = subprocess.Popen(
            argv,
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=box,
            env=_child_env(box_in),
            start_new_session=True,  # its own process group, killed as a whole
        )
    try:
        deadline = start + limits.time_limit_s + STARTUP_GRACE_S
        out, err, timed_out, limited = _collect(proc, deadline, limits.output_limit_bytes)
    finally:
        _kill_everything(proc, uid, marker)
    return RunOutcome(
        stdout=bytes(out[: limits.output_limit_bytes]),
        stderr_tail=err.decode("utf-8", errors="replace"),
        status=None,
        returncode=proc.returncode,
        timed_out=timed_out,
        output_limited=limited,
        elapsed_s=time.monotonic() - start,
    )


def _collect(
    proc: subprocess.Popen[bytes], deadline: float, cap: int
) -> tuple[bytearray, bytearray, bool, bool]:
    """Read stdout and stderr until both close, the deadline passes or the output cap is hit.

    Orphans can hold the pipes open after the program exits; we stop shortly after it does.
    """
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    total, exited_at = 0, None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return out, err[-STDERR_TAIL:], True, False
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:
                break
            for key, _ in sel.select(min(0.05, deadline - now)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                total += len(chunk)
                key.data.extend(chunk)
                if total > cap:
                    return out, err[-STDERR_TAIL:], False, True
                if len(err) > 2 * STDERR_TAIL:
                    del err[:-STDERR_TAIL]
    return out, err[-STDERR_TAIL:], False, False


def _kill_everything(proc: subprocess.Popen[bytes], uid: int | None, marker: str) -> None:
    """SIGKILL the process group, then anything still running as the private uid or carrying
    the marker (a program may leave its group with setsid); loop until none is left."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    for _ in range(200):
        if not _kill_leftovers(uid, marker):
            return
        time.sleep(0.005)


def _kill_leftovers(uid: int | None, marker: str) -> int:
    """Kill live processes that belong to this run; returns how many were found."""
    found = 0
    needle = marker.encode()
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            ours = uid is not None and proc_dir.stat().st_uid == uid
            ours = ours or needle in (proc_dir / "cmdline").read_bytes()
            if not ours or (proc_dir / "stat").read_bytes().rsplit(b")", 1)[1][1:2] == b"Z":
                continue
            os.kill(int(proc_dir.name), signal.SIGKILL)
            found += 1
        except (OSError, IndexError):
            continue  # it exited while we looked
    return found


def _with_status(outcome: RunOutcome, nonce: str) -> RunOutcome:
    """Parse the harness's nonce-prefixed status (stderr) and call result (stdout)."""
    head = nonce + " "
    for line in reversed(outcome.stderr_tail.splitlines()):
        if line.startswith(head):
            with suppress(ValueError):
                outcome.status = json.loads(line[len(head) :])
            break
    if outcome.stdout:
        text = outcome.stdout.decode("utf-8", errors="replace")
        for line in reversed(text.splitlines()):
            if line.startswith(head):
                outcome.call_result = line[len(head) :]
                break
    return outcome
