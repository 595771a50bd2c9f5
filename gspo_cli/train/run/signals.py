"""Stopping a run on SIGTERM (preemption) or Ctrl-C, and the one line that says how to resume.

SIGTERM does not kill the trainer: its handler sets `StopRequest.requested`, and the loop, which
polls it at every step boundary, saves a checkpoint and raises `Stopped` (exit 143). A boundary
must come within `trainer.stop_grace_s`; otherwise (a long step, the cold start, model loading)
or on a second SIGTERM, `Stopped` is raised wherever the main thread is. Ctrl-C stays Python's
KeyboardInterrupt (exit 130). Either way the CLI prints one line, `stop_message`.

The loop's hook is one line at the end of each step, after that step's own checkpoint (if any):

    run.stop_at_boundary(step)   # PreparedRun: checkpoint + raise Stopped when a stop was asked
"""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gspo_cli.core.errors import Stopped
from gspo_cli.runs.folder import CHECKPOINTS, LATEST, METRICS, SAMPLES, read_jsonl

if TYPE_CHECKING:  # no torch import here: the CLI reads this module before the heavy imports
    from gspo_cli.train.engines.distributed import DistContext

INTERRUPT_EXIT = 128 + signal.SIGINT  # 130, the shell's code for Ctrl-C


class StopRequest:
    """Set by the SIGTERM handler, read by the loop at step boundaries (`requested`)."""

    def __init__(self, grace_s: float = 0.0) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def agreed(self, ctx: DistContext) -> bool:
        """`requested` on any rank (a collective: every rank must call it at the same step), so
        that all ranks take the same checkpoint together."""
        if ctx.world == 1:
            return self.requested
        return ctx.all_reduce_sum(1.0 if self.requested else 0.0) > 0

    def stopping(self) -> None:
        """The loop is at its boundary and stops: the grace timer must not cut its save short."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler (main thread): first signal asks, a repeat or expiry stops now."""
        if self.requested or self.grace_s <= 0:
            self.stopping()
            raise Stopped(self.signum or signum)
        self.signum = signum
        # A real signal to the main thread on expiry: it also wakes a blocking wait.
        main = threading.main_thread().ident or 0
        self._timer = threading.Timer(self.grace_s, signal.pthread_kill, (main, signum))
        self._timer.daemon = True
        self._timer.start()


@contextmanager
def stop_on_signals(grace_s: float) -> Iterator[StopRequest]:
    """SIGTERM is handled by a StopRequest inside the block (only the main thread may install
    handlers; elsewhere the request is never set and SIGTERM keeps its default)."""
    stop = StopRequest(grace_s)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGTERM, stop.handle)
    try:
        yield stop
    finally:
        stop.stopping()
        signal.signal(signal.SIGTERM, previous)


def resume_command(argv: list[str]) -> str:
    """The command that continues this run: the same arguments, plus --resume."""
    args = [a for a in argv if a != "--resume"]
    return shlex.join(["gspo", *args, "--resume"])


def stop_message(run_dir: Path, argv: list[str]) -> str:
    """`stopped at step N (...); resume with: gspo train ... --resume`, read from the run folder,
    so that it states what is on disk, not what the loop meant to do."""
    steps = [int(r["step"]) for r in read_jsonl(run_dir / METRICS) if "step" in r]
    done = max(steps, default=0)
    saved = _checkpoint_step(run_dir / CHECKPOINTS / LATEST)
    if done == 0:
        where = "stopped before step 1"
    elif saved == done:
        where = f"stopped at step {done} (checkpoint saved)"
    elif saved is None:
        where = f"stopped at step {done} (no checkpoint yet: a resume starts from step 0)"
    else:
        where = f"stopped at step {done} (last checkpoint: step {saved}, where a resume starts)"
    return f"{where}; resume with: {resume_command(argv)}"


def eval_stop_message(out: Path, argv: list[str]) -> str:
    """`gspo eval` keeps every finished problem: say how many, and how to go on."""
    done = len(read_jsonl(out / SAMPLES))
    return f"stopped with {done} problem(s) done in {out}; resume with: {resume_command(argv)}"


def _checkpoint_step(pointer: Path) -> int | None:
    """The step `checkpoints/latest` names, or None."""
    try:
        return int(pointer.read_text(encoding="utf-8").strip().removeprefix("step_"))
    except (OSError, ValueError):
        return None
