"""What a person sees while training: a rich progress bar with a compact live line."""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from gspo_cli.rewards.judges.reward import parse_failure_share
from gspo_cli.runs.folder import EVALS, read_jsonl

LIVE_KEYS = (
    ("reward_mean", "reward", "{:.3f}"),
    ("clip_frac", "clip", "{:.3f}"),
    ("entropy", "ent", "{:.2f}"),
    ("response_len_mean", "len", "{:.1f}"),
    ("tool_calls_per_response", "calls", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
)


def live_line(metrics: dict[str, float]) -> str:
    parts = [
        f"{label} {fmt.format(metrics[key])}" for key, label, fmt in LIVE_KEYS if key in metrics
    ]
    unparsed = parse_failure_share(metrics)
    if unparsed:  # those rewards are on_parse_failure's, not the judge's: never a silent zero
        parts.insert(1, f"judge unparsed {unparsed:.0%}")
    return "  ".join(parts)


# The answer forms beside held-out accuracy (eval.jsonl keys, train/run/heldout.py), labelled.
FORMS = (("answered", "answered"), ("accuracy_any_form", "any form"), ("ran_clean", "ran clean"))


def heldout_change(run_dir: Path, heldout: dict[int, float]) -> str:
    """The run's last word on held-out evaluation: strict accuracy before RL -> after the last
    evaluated step, then the answer forms where both ends measured them (eval.jsonl), so that
    a gain in answer format alone shows beside a gain in correct answers."""
    last = max(heldout)
    before, after = heldout[0], heldout[last]
    line = (
        f"held-out accuracy: before RL {before:.1%} -> after {last} steps {after:.1%} "
        f"({(after - before) * 100:+.1f} points)"
    )
    records = {r.get("step"): r for r in read_jsonl(run_dir / EVALS)}  # the later record wins
    ends = (records.get(0, {}), records.get(last, {}))
    for key, label in FORMS:
        first, final = (end.get(key) for end in ends)
        if isinstance(first, int | float) and isinstance(final, int | float):
            line += f"; {label} {first:.1%} -> {final:.1%}"
    return line


def eta_text(done: int, total: int, started: float) -> str:
    """ "eta 1m05s" from the average time per unit so far."""
    if done <= 0 or done >= total:
        return "eta 0s" if done >= total else "eta ?"
    left = (time.perf_counter() - started) / done * (total - done)
    minutes, seconds = divmod(int(left), 60)
    return f"eta {minutes}m{seconds:02d}s" if minutes else f"eta {seconds}s"


class PhaseProgress:
    """Progress of a long phase (cold start, evaluation) with an ETA: a live bar on a
    terminal, a plain line every `every` units otherwise (logs, CI)."""

    def __init__(self, console: Console, label: str, total: int, plain: bool) -> None:
        self.console, self.label, self.total = console, label, total
        self.plain = plain or not console.is_terminal
        self.every = max(1, total // 10)
        self.started = time.perf_counter()
        self.progress = Progress(
            TextColumn(f"[bold]{label}[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=self.plain,
            transient=True,
        )
        self.task = self.progress.add_task("", total=total)

    def __enter__(self) -> PhaseProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def update(self, done: int, extra: str = "") -> None:
        self.progress.update(self.task, completed=done)
        if self.plain and (done % self.every == 0 or done == self.total):
            eta = eta_text(done, self.total, self.started)
            line = f"{self.label} {done}/{self.total}  {eta}"
            self.console.print(f"{line}  {extra}" if extra else line, highlight=False)


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
        self.start, self.started = start, time.perf_counter()

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
            eta = eta_text(step - self.start, self.total - self.start, self.started)
            self.console.print(f"step {step}/{self.total}  {line}  {eta}", highlight=False)
        self.progress.update(self.task, completed=step, description=line)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False)
