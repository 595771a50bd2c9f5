"""What a person sees while `gspo eval` runs: problems done, with an ETA, on stderr.

A live bar on a terminal; otherwise (logs, CI, a pipe) a plain line at the first problem, every
tenth of them, at least every `PLAIN_EVERY_S` seconds and at the end, so that a long evaluation
never looks hung. stdout keeps only the results.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_EVERY_S = 30.0


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class EvalProgress:
    """Problems finished out of `total`, `done` of them by an earlier run (--resume)."""

    def __init__(self, total: int, done: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, markup=False, highlight=False)
        self.total, self.done, self.resumed = total, done, done
        self.plain = not self.console.is_terminal
        self.every = max(1, total // 10)
        self.started = self.last_line = time.monotonic()
        self.progress = Progress(
            TextColumn("[bold]eval[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=self.plain,
            transient=True,
        )
        self.task = self.progress.add_task("", total=total, completed=done)

    def __enter__(self) -> EvalProgress:
        self.progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def advance(self) -> None:
        """One more problem finished."""
        self.done += 1
        self.progress.update(self.task, completed=self.done)
        now = time.monotonic()
        new = self.done - self.resumed
        due = new == 1 or self.done % self.every == 0 or self.done == self.total
        if self.plain and (due or now - self.last_line >= PLAIN_EVERY_S):
            self.last_line = now
            self.console.print(self.line(now), highlight=False)

    def line(self, now: float) -> str:
        """'eval 12/30 problems, 40s, eta 1m00s': the ETA from this run's pace alone."""
        elapsed = now - self.started
        new = self.done - self.resumed
        text = f"eval {self.done}/{self.total} problems, {_duration(elapsed)}"
        if self.done < self.total and new > 0:
            text += f", eta {_duration(elapsed / new * (self.total - self.done))}"
        return text
