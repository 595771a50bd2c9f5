"""Training rows from a data source: `builtin:TASK`, `benchmark:NAME[:PATH]`, a local file or a
hub id. This module owns the source prefixes and parses them; it imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gspo_cli.data.arithmetic import arithmetic_split
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.errors import GspoError
from gspo_cli.registry import UnknownNameError

if TYPE_CHECKING:
    from gspo_cli.recipe.schema import DataConfig

BUILTIN_TASK_PREFIX = "builtin:"  # builtin:arithmetic
BENCHMARK_PREFIX = "benchmark:"  # benchmark:NAME or benchmark:NAME:PATH (a local file/folder)
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def split_benchmark_source(source: str) -> tuple[str, str | None] | None:
    """(name, local path or None) for "benchmark:NAME[:PATH]"; None for any other source."""
    if not source.startswith(BENCHMARK_PREFIX):
        return None
    name, _, path = source.removeprefix(BENCHMARK_PREFIX).partition(":")
    return name, path or None


def load_rows(source: str, split: str, cfg: DataConfig) -> list[dict[str, Any]]:
    """Rows with at least `prompt` and `answer` keys (renamed from the recipe's columns)."""
    if source.startswith(BUILTIN_TASK_PREFIX):
        task = source.removeprefix(BUILTIN_TASK_PREFIX)
        if task != "arithmetic":
            raise GspoError(f"data.source: unknown built-in task {task!r}; known: arithmetic")
        return arithmetic_split(cfg.arithmetic, split, cfg.seed)
    benchmark = split_benchmark_source(source)
    if benchmark is not None:
        return benchmark_rows(*benchmark)
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


def benchmark_rows(name: str, path: str | None = None) -> list[dict[str, Any]]:
    """Rows of a registered benchmark, with its own prompt format.

    Code problems carry `tests` (parsed test cases) for the code reward.
    """
    try:
        problems = load_benchmark(name, path)
    except UnknownNameError as exc:
        raise GspoError(f"data.source: {exc}") from None
    return [
        {"prompt": build_prompt(p), "answer": p.answer, "tests": p.tests, "id": p.id}
        for p in problems
    ]


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
