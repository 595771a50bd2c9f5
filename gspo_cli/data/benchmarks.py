"""Benchmarks by name: where their data lives, how rows become `Problem`s, and their prompts.

    problems = load_benchmark("aime24", data="path/to/aime24.jsonl")
    prompt = build_prompt(problems[0])

Data sources, in order:

1. `data`: a local file (.json list, .jsonl, .parquet) or a folder of them (all files, sorted);
2. else, when GSPO_BENCHMARKS_DIR is set and holds the benchmark's default file, that file
   (the layout of the shared benchmark folder, e.g. $GSPO_BENCHMARKS_DIR/aime24/...);
3. else the benchmark's hub data set through `datasets.load_dataset` (or `hub_id`); when that
   fails (offline, say) a one-line GspoError names `--data PATH` as the fix.

`columns` renames source columns before parsing ({field: source column}), so a file with other
column names still loads; the `custom` benchmark reads the fields in `CUSTOM_FIELDS` this way.
Problem ids must be unique: two copies of one benchmark in a folder is an error, not a merge.
Rows are parsed in file order; folders are read file by file in name order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from gspo_cli.core.errors import GspoError
from gspo_cli.core.registry import Registry
from gspo_cli.data.code_rows import parse_codeforces, parse_livecodebench
from gspo_cli.data.files import HubSource, data_files, load_hub_rows, read_file_rows
from gspo_cli.data.problems import (
    CUSTOM_FIELDS,
    Kind,
    Problem,
    RowParser,
    parse_aime,
    parse_custom,
    parse_gsm8k,
    parse_math500,
)

BENCHMARKS_DIR_ENV = "GSPO_BENCHMARKS_DIR"

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_SYSTEM = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all "
    "tests. You will NOT return anything except for the program."
)
CODE_FORMAT_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose "
    "your code within delimiters."
)
CODE_FORMAT_STDIN = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows."
)


def math_prompt(problem: Problem) -> str:
    """The question, then the step-by-step / \\boxed{} instruction (DeepSeek-R1, Qwen)."""
    return f"{problem.question}\n{MATH_INSTRUCTION}"


def code_prompt(problem: Problem) -> str:
    """The LiveCodeBench prompt: question, then starter code (call-based) or stdin/stdout."""
    if problem.starter_code:
        fmt = f"{CODE_FORMAT_STARTER}\n```python\n{problem.starter_code}\n```\n\n"
    else:
        fmt = f"{CODE_FORMAT_STDIN}\n```python\n# YOUR CODE HERE\n```\n\n"
    return (
        f"{CODE_SYSTEM}\n### Question:\n{problem.question}\n\n### Format: {fmt}"
        "### Answer: (use the provided format with backticks)\n\n"
    )


def prompt_by_kind(problem: Problem) -> str:
    """Maths or code prompt by the problem's kind (for benchmarks that mix them)."""
    return code_prompt(problem) if problem.kind == "code" else math_prompt(problem)


@dataclass(frozen=True)
class BenchmarkSpec:
    """A registered benchmark: parser, prompt, default local file and hub source."""

    name: str
    kind: Kind | None  # None: decided per problem (custom)
    parse: RowParser
    prompt: Callable[[Problem], str]
    default_path: str | None = None  # relative to $GSPO_BENCHMARKS_DIR
    hub: HubSource | None = None
    description: str = ""


BENCHMARKS: Registry[BenchmarkSpec] = Registry("benchmark")

_LCB_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl")
_LCB_REPO = "livecodebench/code_generation_lite"

for _spec in (
    BenchmarkSpec(
        "aime24", "math", parse_aime, math_prompt, "aime24/qwen25math_aime24_test.jsonl",
        HubSource("HuggingFaceH4/aime_2024", "train"), "AIME 2024 I+II, 30 integer answers",
    ),
    BenchmarkSpec(
        "aime25", "math", parse_aime, math_prompt, "aime25/gkv_aime25.jsonl",
        HubSource("math-ai/aime25", "test"), "AIME 2025 I+II, 30 integer answers",
    ),
    BenchmarkSpec(
        "math500", "math", parse_math500, math_prompt, "math500/deepscaler_math500_test.json",
        HubSource("HuggingFaceH4/MATH-500", "test"), "MATH-500 (Let's Verify Step by Step)",
    ),
    BenchmarkSpec(
        "gsm8k", "math", parse_gsm8k, math_prompt, "gsm8k/qwen25math_gsm8k_test.jsonl",
        HubSource("openai/gsm8k", "test", name="main"), "GSM8K test, 1319 problems",
    ),
    BenchmarkSpec(
        "livecodebench", "code", parse_livecodebench, code_prompt,
        "livecodebench/sandboxfusion_lcb_v1_sample.jsonl",
        HubSource(
            "json", "train", data_files=tuple(f"hf://datasets/{_LCB_REPO}/{f}" for f in _LCB_FILES),
            shown=_LCB_REPO,
        ),
        "LiveCodeBench code generation (release_v5 files on the hub); filter by contest date",
    ),
    BenchmarkSpec(
        "codeforces", "code", parse_codeforces, code_prompt, "codeforces",
        HubSource("deepmind/code_contests", "test"), "CodeContests and CodeElo problems",
    ),
    BenchmarkSpec(
        "custom", None, parse_custom, prompt_by_kind, None, None,
        f"any local file; map columns to {', '.join(CUSTOM_FIELDS)}",
    ),
):  # fmt: skip
    BENCHMARKS.register(_spec.name)(_spec)


def build_prompt(problem: Problem) -> str:
    """The prompt for a problem, with its benchmark's template."""
    return BENCHMARKS.get(problem.benchmark).prompt(problem)


def _rename(row: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """Copy of `row` with row[field] = row[source] for each {field: source} of `columns`."""
    out = dict(row)
    for target, source in columns.items():
        out[target] = row.get(source)
    return out


def _check_columns(
    spec: BenchmarkSpec, columns: Mapping[str, str], first: Mapping[str, Any]
) -> None:
    if spec.name == "custom":
        unknown = sorted(set(columns) - set(CUSTOM_FIELDS))
        if unknown:
            raise GspoError(
                f"custom: unknown field(s) {unknown}; known: {', '.join(CUSTOM_FIELDS)}"
            )
    missing = sorted(source for source in columns.values() if source not in first)
    if missing:
        raise GspoError(f"{spec.name}: no column(s) {missing} in the data; has {sorted(first)}")


def _parse_rows(
    spec: BenchmarkSpec, rows: list[dict[str, Any]], where: str, columns: Mapping[str, str]
) -> list[Problem]:
    if rows and columns:
        _check_columns(spec, columns, rows[0])
    problems = []
    for i, row in enumerate(rows):
        try:
            problems.append(spec.parse(_rename(row, columns), i, spec.name))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            msg = f"missing column {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise GspoError(f"{where}: row {i}: {spec.name}: {msg}") from None
    return problems


def _default_file(spec: BenchmarkSpec) -> Path | None:
    root = os.environ.get(BENCHMARKS_DIR_ENV)
    if not root or spec.default_path is None:
        return None
    path = Path(root) / spec.default_path
    return path if path.exists() else None


def _add_unique(problems: dict[str, Problem], new: list[Problem], where: str) -> None:
    """Add `new` to `problems` by id; a repeated id is an error naming where it came from."""
    for p in new:
        if p.id in problems:
            raise GspoError(
                f"{where}: duplicate problem id {p.id!r} (two copies of the data in one "
                "folder?); pass one file with --data PATH"
            )
        problems[p.id] = p


def _load_problems(
    spec: BenchmarkSpec,
    data: str | Path | None,
    hub: HubSource | None,
    columns: Mapping[str, str],
) -> list[Problem]:
    local = Path(data) if data is not None else (None if hub else _default_file(spec))
    problems: dict[str, Problem] = {}
    if local is not None:
        for file in data_files(local):
            rows = _parse_rows(spec, read_file_rows(file), str(file), columns)
            _add_unique(problems, rows, str(file))
        return list(problems.values())
    hub = hub or spec.hub
    if hub is None:
        raise GspoError(f"{spec.name}: no data given; pass a local file with --data PATH")
    _add_unique(problems, _parse_rows(spec, load_hub_rows(hub), hub.label, columns), hub.label)
    return list(problems.values())


def _as_date(value: date | str | None, what: str) -> date | None:
    if value is None or isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise GspoError(f"{what} date {value!r} is not YYYY-MM-DD") from None


def filter_by_date(
    problems: list[Problem], start: date | str | None = None, end: date | str | None = None
) -> list[Problem]:
    """Problems whose contest_date lies in [start, end] (both inclusive; None = open end).

    Undated problems are dropped when a bound is given; if no problem has a date, that is an
    error rather than an empty benchmark.
    """
    lo, hi = _as_date(start, "start"), _as_date(end, "end")
    if lo is None and hi is None:
        return problems
    if lo is not None and hi is not None and lo > hi:
        raise GspoError(f"empty date window: start {lo} is after end {hi}")
    if not any(p.contest_date for p in problems):
        raise GspoError("cannot filter by contest date: the data has no contest_date")
    return [
        p
        for p in problems
        if p.contest_date is not None
        and (lo is None or p.contest_date >= lo)
        and (hi is None or p.contest_date <= hi)
    ]


def load_benchmark(
    name: str,
    data: str | Path | None = None,
    *,
    hub_id: str | None = None,
    hub_split: str = "test",
    columns: Mapping[str, str] | None = None,
    start: date | str | None = None,
    end: date | str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Load benchmark `name` as a list of Problems (sources and options: module docstring).

    `start` / `end` keep problems with a contest date in the window (see `filter_by_date`);
    `limit` keeps the first N afterwards. `hub_id` / `hub_split` name a hub data set to use
    instead of the benchmark's own (ignored when `data` is given). Unknown names raise
    UnknownNameError listing the known ones; bad data raises GspoError naming file and row.
    """
    spec = BENCHMARKS.get(name)
    if spec.name == "custom" and data is None and hub_id is None:
        raise GspoError("custom: pass the data file with --data PATH")
    hub = HubSource(hub_id, hub_split) if hub_id else None
    problems = _load_problems(spec, data, hub, columns or {})
    problems = filter_by_date(problems, start, end)
    if limit is not None:
        problems = problems[: max(limit, 0)]
    if not problems:
        raise GspoError(f"{name}: no problems left to evaluate")
    return problems
