"""What a person sees while training: a rich progress bar with a compact live line."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

LIVE_KEYS = (
    ("reward_mean", "reward", "{:.3f}"),
    ("clip_frac", "clip", "{:.3f}"),
    ("entropy", "ent", "{:.2f}"),
    ("response_len_mean", "len", "{:.1f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
)


def live_line(metrics: dict[str, float]) -> str:
    parts = [
        f"{label} {fmt.format(metrics[key])}" for key, label, fmt in LIVE_KEYS if key in metrics
    ]
    return "  ".join(parts)


class TrainingDisplay:
    """Rich progress on a terminal; one plain line per step otherwise (logs, CI)."""

    def __init__(self, console: Console, total: int, start: int, mode: str) -> None:
        self.console = console
        self.plain = mode == "plain" or not console.is_terminal
        self.total = total
        self.progress = Progress(
            TextColumn("[bold]RL[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=console,
            disable=self.plain,
        )
        self.task = self.progress.add_task("", total=total, completed=start)

    def __enter__(self) -> TrainingDisplay:
        self.progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        line = live_line(metrics)
        if self.plain:
            self.console.print(f"step {step}/{self.total}  {line}", highlight=False)
        self.progress.update(self.task, completed=step, description=line)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False)
