"""The code benchmarks' row parsers: LiveCodeBench (hub release files, SandboxFusion samples
or their decoded copy) and Codeforces (CodeContests from SandboxFusion or deepmind, and rllm's
CodeElo copy), each row to a `Problem` with its parsed tests (data/problems.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gspo_cli.data.problems import (
    Problem,
    date_of,
    extra_of,
    first,
    level_of,
    rating_of,
    text_of,
)
from gspo_cli.data.testcases import TestCase, merge_tests, parse_tests

# ----------------------------------------------------------------------------- LiveCodeBench

_LCB_QUESTION = re.compile(r"### Question:\n(.*?)\n\n### Format:", re.S)
_LCB_STARTER = re.compile(
    r"### Format: You will use the following starter code.*?\n```python\n(.*?)\n```\n\n### Answer:",
    re.S,
)


def split_lcb_prompt(prompt: str) -> tuple[str, str]:
    """(question, starter code) recovered from a prompt in the LiveCodeBench format."""
    match = _LCB_QUESTION.search(prompt)
    if not match:
        raise ValueError("prompt is not in the LiveCodeBench '### Question:' format")
    starter = _LCB_STARTER.search(prompt)
    return match.group(1), starter.group(1) if starter else ""


def _lcb_hub_tests(row: Mapping[str, Any]) -> tuple[TestCase, ...]:
    """public_test_cases + private_test_cases (JSON or compressed), fn_name from metadata."""
    meta = row.get("metadata") or {}
    meta = json.loads(meta) if isinstance(meta, str) else meta
    parts = [parse_tests(row["public_test_cases"])]
    if row.get("private_test_cases"):
        parts.append(parse_tests(row["private_test_cases"]))
    return merge_tests(*parts, fn_name=meta.get("func_name") or None)


def _lcb_fields(row: Mapping[str, Any]) -> tuple[str, str, str, tuple[TestCase, ...]]:
    """(id, question, starter code, tests) from any of the three LCB row shapes."""
    if "question_content" in row:  # the hub / lcb_runner release files
        qid = str(first(row, "question_id", "id"))
        starter = str(row.get("starter_code") or "")
        return qid, text_of(row, "question_content"), starter, _lcb_hub_tests(row)
    labels = row.get("labels") or {}
    labels = json.loads(labels) if isinstance(labels, str) else labels
    qid = str(first(row, "task_id") or labels.get("task_id") or first(row, "id"))
    question, starter = split_lcb_prompt(text_of(row, "content", "prompt"))
    tests = tuple(parse_tests(row.get("test", row)))  # SandboxFusion, or the decoded copy
    return qid, question, starter, tests


def parse_livecodebench(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """LiveCodeBench rows: hub release files, SandboxFusion samples or their decoded copy."""
    qid, question, starter, tests = _lcb_fields(row)
    labels = row.get("labels") or {}
    labels = json.loads(labels) if isinstance(labels, str) else labels
    platform = first(row, "platform", "category") or labels.get("category")
    return Problem(
        id=qid,
        benchmark=benchmark,
        kind="code",
        question=question,
        tests=tests,
        starter_code=starter,
        contest_date=date_of(row.get("contest_date")),
        difficulty=level_of(first(row, "difficulty") or labels.get("difficulty")),
        platform=str(platform) if platform else None,
        metadata=extra_of(row, "question_title", "contest_id"),
    )


# ----------------------------------------------------------------------------- Codeforces

# deepmind/code_contests enums (source); the SandboxFusion copy spells them out.
_CC_SOURCES = {1: "codechef", 2: "codeforces", 3: "hackerearth", 4: "codejam", 5: "atcoder"}
_LIMITS = re.compile(r"Time Limit: (\d+) ms\s*\nMemory Limit: (\d+) MB")


def _code_contests_id(name: str, platform: str) -> tuple[str, str | None]:
    """("codeforces/1000_A", "A") from "1000_A. Codehorses T-shirts"; other sources keep name."""
    match = re.match(r"(\d+)_([A-Z]\d?)\. ", name)
    if platform == "codeforces" and match:
        return f"codeforces/{match.group(1)}_{match.group(2)}", match.group(2)
    return f"{platform}/{name.strip()}", None


def _parse_code_contests(row: Mapping[str, Any], benchmark: str) -> Problem:
    if "labels" in row:  # SandboxFusion: statement in content, JSON labels and tests
        labels = row["labels"]
        labels = json.loads(labels) if isinstance(labels, str) else labels
        platform, name = str(labels.get("source", "")).lower(), str(labels.get("name", ""))
        question, tests = text_of(row, "content"), tuple(parse_tests(row["test"]))
        difficulty, rating = labels.get("difficulty"), None
    else:  # deepmind/code_contests: public + private + generated tests, CF metadata
        platform = _CC_SOURCES.get(int(row.get("source") or 0), "unknown")
        name, question = str(row["name"]), text_of(row, "description")
        keys = ("public_tests", "private_tests", "generated_tests")
        tests = merge_tests(*(parse_tests(row[k]) for k in keys if row.get(k)))
        difficulty, rating = row.get("cf_index"), rating_of(row.get("cf_rating"))
    pid, index = _code_contests_id(name, platform)
    return Problem(
        id=pid,
        benchmark=benchmark,
        kind="code",
        question=question,
        tests=tests,
        difficulty=level_of(index or difficulty),
        rating=rating,
        platform=platform,
        metadata={"name": name, "source": "code_contests"},
    )


def _parse_codeelo(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """rllm's CodeElo copy: statement (with tags and limits) and sample tests only."""
    question = text_of(row, "problem")
    meta: dict[str, Any] = {"source": "codeelo", "sample_tests_only": True}
    limits = _LIMITS.search(question)
    if limits:
        meta["time_limit_s"] = int(limits.group(1)) / 1000
        meta["memory_limit_mb"] = int(limits.group(2))
    return Problem(
        id=str(row.get("id") or f"codeelo-{index}"),
        benchmark=benchmark,
        kind="code",
        question=question.strip(),
        tests=tuple(parse_tests(row["tests"])),
        rating=rating_of(row.get("rating")),
        platform="codeforces",
        metadata=meta,
    )


def parse_codeforces(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """Codeforces-style rows: CodeContests (SandboxFusion or deepmind) or rllm's CodeElo copy."""
    if "problem" in row and "tests" in row:
        return _parse_codeelo(row, index, benchmark)
    if "labels" in row or "public_tests" in row:
        return _parse_code_contests(row, benchmark)
    raise ValueError(f"not a CodeContests or CodeElo row; has {sorted(row)}")
