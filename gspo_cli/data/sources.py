"""Training rows from a data source: `builtin:TASK`, `benchmark:NAME[:PATH]`,
`reasoning_gym:TASK` (data/reasoning_gym.py), a local file or a hub id. This module owns the
source prefixes and parses them; it imports no torch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Protocol

from gspo_cli.core.errors import GspoError
from gspo_cli.core.registry import UnknownNameError
from gspo_cli.data.arithmetic import ArithmeticSettings, arithmetic_split
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import Prompt
from gspo_cli.data.reasoning_gym import ReasoningGymSettings, reasoning_gym_split, task_of

BUILTIN_TASK_PREFIX = "builtin:"  # builtin:arithmetic
BENCHMARK_PREFIX = "benchmark:"  # benchmark:NAME or benchmark:NAME:PATH (a local file/folder)
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


class RowSettings(Protocol):
    """What reading rows needs of the recipe's data section (read-only here)."""

    @property
    def prompt_column(self) -> str: ...
    @property
    def answer_column(self) -> str: ...
    @property
    def arithmetic(self) -> ArithmeticSettings: ...
    @property
    def seed(self) -> int: ...
    @property
    def reasoning_gym(self) -> ReasoningGymSettings: ...


def split_benchmark_source(source: str) -> tuple[str, str | None] | None:
    """(name, local path or None) for "benchmark:NAME[:PATH]"; None for any other source."""
    if not source.startswith(BENCHMARK_PREFIX):
        return None
    name, _, path = source.removeprefix(BENCHMARK_PREFIX).partition(":")
    return name, path or None


def load_rows(source: str, split: str, cfg: RowSettings) -> list[dict[str, Any]]:
    """Rows with at least `prompt` and `answer` keys (renamed from the recipe's columns)."""
    if source.startswith(BUILTIN_TASK_PREFIX):
        task = source.removeprefix(BUILTIN_TASK_PREFIX)
        if task != "arithmetic":
            raise GspoError(f"data.source: unknown built-in task {task!r}; known: arithmetic")
        try:
            return arithmetic_split(cfg.arithmetic, split, cfg.seed)
        except ValueError as exc:
            raise GspoError(f"data: {exc}") from None
    benchmark = split_benchmark_source(source)
    if benchmark is not None:
        return benchmark_rows(*benchmark)
    if task_of(source) is not None:
        return reasoning_gym_rows(source, split, cfg)[0]
    rows = _load_dataset_rows(source, split)
    if not rows:
        raise GspoError(f"data: {source} has no rows (split {split!r})")
    for column in (cfg.prompt_column, cfg.answer_column):
        if column not in rows[0]:
            raise GspoError(
                f"data: column {column!r} not in {source} (columns: {', '.join(rows[0])}); "
                "set data.prompt_column / data.answer_column"
            )
    return [
        {**row, "prompt": row[cfg.prompt_column], "answer": row[cfg.answer_column]} for row in rows
    ]


def reasoning_gym_rows(
    source: str, split: str, cfg: RowSettings
) -> tuple[list[dict[str, Any]], str | None]:
    """A `reasoning_gym:` source's rows of `split`, and the line saying what was dropped to keep
    training and held-out problems apart (None: nothing was)."""
    try:
        splits = reasoning_gym_split(source, cfg.reasoning_gym, cfg.seed, split)
    except ValueError as exc:
        raise GspoError(f"data: {exc}") from None
    return list(splits.train if split == "train" else splits.heldout), splits.note


def source_note(source: str, split: str, cfg: RowSettings) -> str | None:
    """The line saying what a source dropped on its own (a reasoning_gym: source's overlap of
    training and held-out problems), else None."""
    return reasoning_gym_rows(source, split, cfg)[1] if task_of(source) is not None else None


def has_splits(source: str) -> bool:
    """False for a local file and a benchmark: source, which have one set of rows only."""
    if source.startswith(BUILTIN_TASK_PREFIX):
        return True
    return split_benchmark_source(source) is None and not Path(source).expanduser().is_file()


def carve_heldout(
    rows: list[dict[str, Any]], count: int, seed: int, source: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows) of one set of rows: `count` distinct prompts drawn with
    `seed` are held out (one row each), and every row asking one of them leaves training, so
    no held-out question is ever trained on, even when the file repeats it."""
    prompts = list(dict.fromkeys(str(r["prompt"]) for r in rows))
    if 2 * count > len(prompts):
        raise GspoError(
            f"data: {source} has {len(prompts)} distinct prompts; holding out {count} "
            "(data.heldout_size, else eval.num_problems) would leave fewer to train on: lower "
            "it, or name held-out data in data.eval_source"
        )
    held = set(random.Random(seed).sample(prompts, count))
    first = {p: i for i, p in reversed(list(enumerate(str(r["prompt"]) for r in rows)))}
    heldout = [rows[first[p]] for p in prompts if p in held]
    return [r for r in rows if str(r["prompt"]) not in held], heldout


def benchmark_rows(name: str, path: str | None = None) -> list[dict[str, Any]]:
    """Rows of a registered benchmark, with its own prompt format.

    Code problems carry `tests` (parsed test cases) for the code reward.
    """
    try:
        problems = load_benchmark(name, path)
    except UnknownNameError as exc:
        raise GspoError(f"data.source: {exc}") from None
    return [
        {"prompt": _prompt(p), "answer": p.answer, "tests": p.tests, "id": p.id} for p in problems
    ]


def _prompt(problem: Problem) -> Prompt:
    """A problem as a training prompt: a conversation's turns (the `custom` benchmark reads
    TRL's conversational rows), else the question in its benchmark's words."""
    return list(problem.messages) if problem.messages is not None else build_prompt(problem)


def _load_dataset_rows(source: str, split: str) -> list[dict[str, Any]]:
    import datasets

    path = Path(source).expanduser()
    try:
        if path.is_file():
            builder = FILE_BUILDERS.get(path.suffix)
            if builder is None:
                raise GspoError(f"data: unsupported file type {path.suffix!r}: {source}")
            if path.stat().st_size == 0:
                return []  # datasets fails on an empty file with a bare StopIteration
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
        elif path.is_dir():
            ds = datasets.load_dataset(str(path), split=split)
        else:
            ds = datasets.load_dataset(source, split=split)
    except GspoError:
        raise
    except Exception as exc:  # datasets raises many types; all mean "cannot load this"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GspoError(f"data: cannot load {source!r} (split {split!r}): {first}") from None
    return [dict(row) for row in ds]
