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
import json
import os
import selectors
import subprocess
import threading
import time
from dataclasses import dataclass

from gspo_cli.sandbox.harness import wire
from gspo_cli.sandbox.isolation import checked_mode
from gspo_cli.sandbox.launch import Limits, Started, enter_box, run_spec, start_run
from gspo_cli.sandbox.program import STARTUP_GRACE_S, STDERR_TAIL, parse_status

EXIT_WAIT_S = 2.0  # after the checker's status: the wrapper's own exit
CELL_LIMIT = 1 << 20  # bytes of one cell's source (a model's turn is far shorter)
ANSWER_LIMIT = 64 * 1024  # bytes of one answer: more is no answer of the harness's
ERROR_CHARS = 1000  # of an answer's error message


@dataclass(frozen=True)
class CellOutcome:
    """What one cell did. `ended`: why the session ended during it ("timeout", "output",
    "memory", "exit", "protocol": its answer could not be read, "lost": the thread that started
    it ended, taking it along; None while it lives on)."""

    stdout: bytes
    error: str | None  # the exception the cell raised: "ZeroDivisionError: division by zero"
    ended: str | None
    exit_code: int | None  # "exit": how the interpreter's process ended (a code, or -signal)
    elapsed_s: float
    stderr_tail: str = ""


class SandboxSession:
    """One trajectory's interpreter. Started at its first cell; `close()` ends it. The sandbox
    dies with the thread that started it (the parent-death signal is a thread's): start it from
    a thread that outlives its use (the sandbox pool's)."""

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
        self._starter: threading.Thread | None = None
        self._cells_w = self._reply_r = -1
        self._sent = 0  # cells sent to this session: the answer echoes its number

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
        mine: list[int] = []  # this side's ends, closed here if the start fails
        try:
            box = enter_box(stack, iso, self.limits)
            cells_r, cells_w = os.pipe2(os.O_CLOEXEC)
            mine.append(cells_w)
            reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
            mine.append(reply_r)
            spec = run_spec(box, "", "session", self.limits, cpu_s=int(self.cpu_budget_s) + 1)
            spec.update(reply_fd=reply_w, cell_limit=CELL_LIMIT + 1024)
            self._run = start_run(box, spec, cells_r, "", pass_fds=(reply_w,))  # closes both
        except BaseException:
            for fd in mine:
                os.close(fd)
            stack.close()
            raise
        os.set_blocking(cells_w, False)  # a cell is written under its call's deadline
        self._run.extra += [cells_w, reply_r]
        self._stack, self._cells_w, self._reply_r = stack, cells_w, reply_r
        self._starter, self._sent = threading.current_thread(), 0

    def run(self, code: str) -> CellOutcome:
        """Run one cell in the session (started first if it is not live)."""
        begun = time.monotonic()
        if self._run is not None and self._starter is not None and not self._starter.is_alive():
            self.close()  # killed with its thread: say so, never blame the cell
            return CellOutcome(b"", None, "lost", None, time.monotonic() - begun)
        self.start()
        run = self._run
        assert run is not None
        cell = wire.encode({"n": self._sent + 1, "code": code}, lambda value: None)
        message = json.dumps(cell).encode()
        if len(message) > CELL_LIMIT:
            too_big = f"InternalError: the cell is {len(message)} bytes; at most {CELL_LIMIT}"
            return CellOutcome(b"", too_big, None, None, time.monotonic() - begun)
        grace = STARTUP_GRACE_S if self._sent == 0 else 0.0
        self._sent += 1
        deadline = time.monotonic() + self.limits.time_limit_s + grace
        call = _Call(run, self._cells_w, self._reply_r, self._sent, deadline, self.limits)
        read = call.read(len(message).to_bytes(8, "little") + message)
        ended, exit_code = read.ended, None
        if ended == "exit":
            exit_code = _exit_code(read.status)
            if run.box.group is not None and run.box.group.oom_killed():
                ended = "memory"
        elif read.answer is not None and read.answer.get("kind") == "memory_limit":
            ended = "memory"  # a MemoryError caught in the cell: the process may be unusable
        if ended is not None:
            self.close()
        error = read.answer.get("error") if read.answer is not None else None
        return CellOutcome(
            stdout=bytes(read.stdout[: self.limits.output_limit_bytes]),
            error=error[:ERROR_CHARS] if isinstance(error, str) else None,
            ended=ended,
            exit_code=exit_code,
            elapsed_s=time.monotonic() - begun,
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
    answer: dict[str, object] | None  # the interpreter's, None when the call ended it
    status: bytearray  # the checker's report: only once the interpreter's process ended
    ended: str | None = None


class _Call:
    """One cell's exchange: the cell written and the output, the answer and the checker's
    status read, all under the call's deadline and caps."""

    def __init__(
        self, run: Started, cells_w: int, reply_r: int, number: int, deadline: float, limits: Limits
    ) -> None:
        self.run, self.cells_w, self.reply_r = run, cells_w, reply_r
        self.number, self.deadline, self.cap = number, deadline, limits.output_limit_bytes
        self.got = _Read(bytearray(), bytearray(), None, bytearray())
        self.answers = bytearray()  # answers as they arrive, length-prefixed

    def read(self, cell: bytes) -> _Read:
        proc, got = self.run.proc, self.got
        assert proc.stdout is not None and proc.stderr is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.cells_w, selectors.EVENT_WRITE, None)
            sel.register(proc.stdout, selectors.EVENT_READ, got.stdout)
            sel.register(proc.stderr, selectors.EVENT_READ, got.stderr)
            sel.register(self.reply_r, selectors.EVENT_READ, self.answers)
            sel.register(self.run.status_r, selectors.EVENT_READ, got.status)
            while got.ended is None and got.answer is None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    got.ended = "timeout"
                    break
                for key, _ in sel.select(min(0.5, left)):
                    if key.data is None:
                        cell = self._write(sel, key.fileobj, cell)
                    elif not (chunk := os.read(key.fd, 1 << 16)):
                        sel.unregister(key.fileobj)
                    else:
                        key.data.extend(chunk)
                self._settle()
        return got

    def _write(self, sel: selectors.BaseSelector, fileobj: object, cell: bytes) -> bytes:
        try:
            cell = cell[os.write(self.cells_w, cell) :]
        except BlockingIOError:
            return cell
        except OSError:  # the interpreter is gone: its status says how
            cell = b""
        if not cell:
            sel.unregister(fileobj)  # type: ignore[arg-type]
        return cell

    def _settle(self) -> None:
        """What the bytes so far say: an answer to this cell, or the session's end."""
        got = self.got
        if len(got.stderr) > 2 * STDERR_TAIL:
            del got.stderr[:-STDERR_TAIL]
        if len(got.stdout) > self.cap:
            got.ended = "output"
            return
        try:
            got.answer = self._answer()
        except wire.WireError:
            got.ended = "protocol"
            return
        if got.answer is not None:
            if not _drain(self.run.proc, got.stdout, self.cap):  # flushed before it answered
                got.ended = "output"
        elif got.status or self.run.proc.poll() is not None:  # the interpreter is gone
            _finish_status(self.run, got.status)
            got.ended = "exit"

    def _answer(self) -> dict[str, object] | None:
        """This cell's answer once all of it arrived (answers to other numbers, a forgery's
        leftovers, are skipped); WireError for what the harness never sends."""
        while len(self.answers) >= 8:
            size = int.from_bytes(self.answers[:8], "little")
            if size > ANSWER_LIMIT:
                raise wire.WireError(f"an answer of {size} bytes")
            if len(self.answers) < 8 + size:
                return None
            answer = wire.decode(bytes(self.answers[8 : 8 + size]), lambda ref: None)
            del self.answers[: 8 + size]
            if isinstance(answer, dict) and answer.get("n") == self.number:
                return answer
        return None


def _drain(proc: subprocess.Popen[bytes], into: bytearray, cap: int) -> bool:
    """What is left in stdout, up to the cap (False past it)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    try:
        while len(into) <= cap and (chunk := os.read(fd, min(1 << 16, cap + 1 - len(into)))):
            into.extend(chunk)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)
    return len(into) <= cap


def _finish_status(run: Started, status: bytearray) -> None:
    """The rest of the checker's report: it writes it whole and exits, then the wrapper ends."""
    end = time.monotonic() + EXIT_WAIT_S
    os.set_blocking(run.status_r, False)
    while time.monotonic() < end and parse_status(status) is None:
        try:
            chunk = os.read(run.status_r, 4096)
        except BlockingIOError:
            chunk = None
        if chunk == b"" and run.proc.poll() is not None:
            return
        status.extend(chunk or b"")
        time.sleep(0.01)


def _exit_code(status: bytearray) -> int | None:
    """How the interpreter's process ended, from the checker's report: its exit code, or minus
    the signal that killed it."""
    parsed = parse_status(status) or {}
    signal, code = parsed.get("signal"), parsed.get("exit")
    if isinstance(signal, int):
        return -signal
    return code if isinstance(code, int) else None
