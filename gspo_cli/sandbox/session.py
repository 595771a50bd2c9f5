"""A live sandboxed Python session: one interpreter process, in the isolation and limits of a
program run (launch.py), kept between calls, so that what a cell made (variables, imports,
files in its box, random draws) is what the next cell sees.

Limits per call: wall time (`Limits.time_limit_s` from the cell's send; the first call also
gets the start-up grace) and output bytes (`output_limit_bytes`). Per session: memory and
processes (the run's cgroup, else rlimits) and CPU time (`cpu_budget_s`). A call past its time
or output limit, or whose cell ends the interpreter (os._exit, a signal, the memory cgroup), or
raises MemoryError, ends the session: its outcome says why, and the next call starts a fresh
one. Ending kills the whole sandbox (ending.py): nothing a cell started outlives it, and the
sandbox dies with the thread that started it (a killed trainer leaves none).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from dataclasses import dataclass

from gspo_cli.sandbox.harness import wire
from gspo_cli.sandbox.isolation import checked_mode
from gspo_cli.sandbox.launch import Limits, Started, enter_box, run_spec, start_run
from gspo_cli.sandbox.program import STARTUP_GRACE_S, STDERR_TAIL, parse_status

EXIT_WAIT_S = 2.0  # after the checker's status: the wrapper's own exit


@dataclass(frozen=True)
class CellOutcome:
    """What one cell did. `ended`: why the session ended during it ("timeout", "output",
    "memory", "exit"; None while it lives on)."""

    stdout: bytes
    error: str | None  # the exception the cell raised: "ZeroDivisionError: division by zero"
    ended: str | None
    exit_code: int | None  # "exit": how the interpreter's process ended (a code, or -signal)
    elapsed_s: float
    stderr_tail: str = ""


class SandboxSession:
    """One trajectory's interpreter. Started at its first cell; `close()` ends it."""

    def __init__(
        self,
        limits: Limits,
        cpu_budget_s: float,
        isolation: str | None = None,
        allow_weak_isolation: bool | None = None,
    ) -> None:
        self.limits = limits
        self.cpu_budget_s = cpu_budget_s
        self.isolation, self.allow_weak = isolation, allow_weak_isolation
        self._stack: contextlib.ExitStack | None = None
        self._run: Started | None = None
        self._cells_w = self._reply_r = -1
        self._fresh = False  # no cell sent yet: the first one also gets the start-up grace

    @property
    def live(self) -> bool:
        return self._run is not None

    def start(self) -> None:
        """Start the interpreter now (it starts at the first cell otherwise). Raises
        WeakIsolationError where only a weak mode is available and not opted into."""
        if self._run is not None:
            return
        iso = checked_mode(self.isolation, self.allow_weak)
        stack = contextlib.ExitStack()
        try:
            box = enter_box(stack, iso, self.limits)
            cells_r, cells_w = os.pipe2(os.O_CLOEXEC)
            reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
            spec = run_spec(box, "", "session", self.limits, cpu_s=int(self.cpu_budget_s) + 1)
            spec["reply_fd"] = reply_w
            self._run = start_run(box, spec, cells_r, "", pass_fds=(reply_w,))
        except BaseException:
            stack.close()
            raise
        self._run.extra += [cells_w, reply_r]
        self._stack, self._cells_w, self._reply_r, self._fresh = stack, cells_w, reply_r, True

    def run(self, code: str) -> CellOutcome:
        """Run one cell in the session (started first if it is not live)."""
        self.start()
        run = self._run
        assert run is not None
        start = time.monotonic()
        grace = STARTUP_GRACE_S if self._fresh else 0.0
        self._fresh = False
        deadline = start + self.limits.time_limit_s + grace
        with contextlib.suppress(OSError):  # gone already (a thread of an earlier cell ended it)
            wire.send(self._cells_w, code)
        read = _read_cell(run, self._reply_r, deadline, self.limits.output_limit_bytes)
        ended = read.ended
        exit_code = None
        if ended == "exit":
            exit_code = _exit_code(read.status)
            if run.box.group is not None and run.box.group.oom_killed():
                ended = "memory"
        elif read.reply is not None and read.reply.get("kind") == "memory_limit":
            ended = "memory"  # a MemoryError caught in the cell: the process may be unusable
        if ended is not None:
            self.close()
        error = read.reply.get("error") if read.reply is not None else None
        return CellOutcome(
            stdout=bytes(read.stdout[: self.limits.output_limit_bytes]),
            error=error if isinstance(error, str) else None,
            ended=ended,
            exit_code=exit_code,
            elapsed_s=time.monotonic() - start,
            stderr_tail=read.stderr[-STDERR_TAIL:].decode("utf-8", errors="replace"),
        )

    def close(self) -> None:
        """End the session and everything it started; the next cell starts a fresh one."""
        run, stack = self._run, self._stack
        self._run, self._stack, self._cells_w, self._reply_r = None, None, -1, -1
        try:
            if run is not None:
                run.end()
        finally:
            if stack is not None:
                stack.close()


@dataclass
class _Read:
    stdout: bytearray
    stderr: bytearray
    reply: dict[str, object] | None  # the interpreter's answer, None when the call ended it
    status: bytearray  # the checker's report: only once the interpreter's process ended
    ended: str | None


def _read_cell(run: Started, reply_fd: int, deadline: float, cap: int) -> _Read:
    """Read the cell's output until its answer, the interpreter's end, the deadline or the cap."""
    proc = run.proc
    assert proc.stdout is not None and proc.stderr is not None
    got = _Read(bytearray(), bytearray(), None, bytearray(), None)
    answer = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, got.stdout)
        sel.register(proc.stderr, selectors.EVENT_READ, got.stderr)
        sel.register(reply_fd, selectors.EVENT_READ, answer)
        sel.register(run.status_r, selectors.EVENT_READ, got.status)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                got.ended = "timeout"
                return got
            for key, _ in sel.select(min(0.5, left)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(got.stderr) > 2 * STDERR_TAIL:
                    del got.stderr[:-STDERR_TAIL]
            if len(got.stdout) > cap:
                got.ended = "output"
                return got
            if (reply := _message(answer)) is not None:
                got.reply = reply
                _drain(proc.stdout.fileno(), got.stdout)  # flushed before the answer was sent
                return got
            if got.status or proc.poll() is not None:  # the interpreter's process is gone
                _finish_status(run, got.status)
                got.ended = "exit"
                return got


def _message(buffer: bytearray) -> dict[str, object] | None:
    """The answer once all of it has arrived (8-byte length, then tagged JSON)."""
    if len(buffer) < 8 or len(buffer) < 8 + int.from_bytes(buffer[:8], "little"):
        return None
    decoded = wire.decode(bytes(buffer[8:]), lambda ref: None)
    return decoded if isinstance(decoded, dict) else {"error": "InternalError: a bad answer"}


def _drain(fd: int, into: bytearray) -> None:
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 1 << 16):
            into.extend(chunk)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)


def _finish_status(run: Started, status: bytearray) -> None:
    """The rest of the checker's report: it writes it whole and exits, then the wrapper ends."""
    end = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < end and parse_status(status) is None:
        with contextlib.suppress(BlockingIOError):
            os.set_blocking(run.status_r, False)
            chunk = os.read(run.status_r, 4096)
            if not chunk and run.proc.poll() is not None:
                return
            status.extend(chunk)
        time.sleep(0.01)


def _exit_code(status: bytearray) -> int | None:
    """How the interpreter's process ended, from the checker's report: its exit code, or minus
    the signal that killed it."""
    parsed = parse_status(status) or {}
    signal, code = parsed.get("signal"), parsed.get("exit")
    if isinstance(signal, int):
        return -signal
    return code if isinstance(code, int) else None
