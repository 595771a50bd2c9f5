"""Run one untrusted program once, in its own sandboxed process (sandbox/launch.py), and collect
what it did. The verdict comes back on a pipe held only by the harness's trusted checker
process.
"""

from __future__ import annotations

import ast
import contextlib
import os
import selectors
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from gspo_cli.sandbox.cgroups import RunGroup
from gspo_cli.sandbox.isolation import checked_mode
from gspo_cli.sandbox.launch import Limits, enter_box, memfd, run_spec, start_run

STARTUP_GRACE_S = 0.5  # interpreter + wrapper start-up, not charged to the program
STDERR_TAIL = 16 * 1024


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
    with contextlib.ExitStack() as stack:
        box = enter_box(stack, iso, limits)
        spec = run_spec(box, code, mode, limits, stdin=stdin, fn_name=fn_name)
        stdin_fd = memfd("stdin", stdin.encode())
        started = start_run(box, spec, stdin_fd, check or "")
        try:
            deadline = started.start + limits.time_limit_s + STARTUP_GRACE_S
            proc = started.proc
            collected = _collect(proc, started.status_r, deadline, limits.output_limit_bytes)
        finally:
            started.end()
        return _outcome(proc, collected, limits, started.start, box.group)


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
        status=parse_status(status),
        returncode=proc.returncode,
        timed_out=timed_out,
        output_limited=limited,
        elapsed_s=time.monotonic() - start,
        oom_killed=group.oom_killed() if group is not None else False,
    )


def parse_status(raw: bytes | bytearray) -> dict[str, Any] | None:
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
