"""Prompt datasets: load rows from a built-in task, a local file or the hub, then tokenise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from gspo_cli.data.arithmetic import arithmetic_split
from gspo_cli.errors import GspoError
from gspo_cli.recipe.schema import BENCHMARK_PREFIX, BUILTIN_PREFIX, DataConfig

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(source: str, split: str, cfg: DataConfig) -> list[dict[str, Any]]:
    """Rows with at least `prompt` and `answer` keys (renamed from the recipe's columns)."""
    if source.startswith(BUILTIN_PREFIX):
        task = source.removeprefix(BUILTIN_PREFIX)
        if task != "arithmetic":
            raise GspoError(f"data.source: unknown built-in task {task!r}; known: arithmetic")
        return arithmetic_split(cfg.arithmetic, split, cfg.seed)
    if source.startswith(BENCHMARK_PREFIX):
        return benchmark_rows(source.removeprefix(BENCHMARK_PREFIX))
    rows = _load_dataset_rows(source, split)
    for column in (cfg.prompt_column, cfg.answer_column):
        if rows and column not in rows[0]:
            raise GspoError(
                f"data: column {column!r} not in {source} (columns: {', '.join(rows[0])}); "
                "set data.prompt_column / data.answer_column"
            )
    return [
        {**row, "prompt": row[cfg.prompt_column], "answer": row[cfg.answer_column]} for row in rows
    ]


def benchmark_rows(spec: str) -> list[dict[str, Any]]:
    """Rows of a registered benchmark ("NAME" or "NAME:PATH"), with its own prompt format.

    Code problems carry `tests` (LiveCodeBench input_output form) for the code reward.
    """
    from gspo_cli.eval import build_prompt, load_benchmark

    name, _, path = spec.partition(":")
    try:
        problems = load_benchmark(name, path or None)
    except KeyError as exc:
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


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str, template: str) -> list[int]:
    """Token ids of one question formatted by `template` and the tokenizer's chat template."""
    content = template.format(prompt=question)
    messages = [{"role": "user", "content": content}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(content)["input_ids"])
