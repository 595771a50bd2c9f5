"""Code reward end to end on real problems: LiveCodeBench, CodeContests and LeetCode asserts.

The solutions (in tests/support/helpers.py, shared with the eval tests, and below) were
written for these tests from the problem statements; each problem is limited to its first
few tests so the file stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gspo_cli.rewards import REWARDS, code_reward, judge_program
from gspo_cli.rewards.code import judge_completions
from tests.support.helpers import (
    BAD,
    CARDS_ABC,
    GOOD,
    SMALLEST_SHUFFLE,
    TAKAHASHI_AOKI,
    TSHIRTS,
    fenced,
)

MAX_TESTS = 10
BENCH = "benchmarks"

MIN_OPERATIONS = """\
class Solution:
    def minOperations(self, nums: List[int], k: int) -> int:
        seen = set()
        for steps, x in enumerate(reversed(nums), 1):
            if x <= k:
                seen.add(x)
            if len(seen) == k:
                return steps
        return len(nums)
"""


def lcb_rows(shared: Path) -> dict[str, dict[str, Any]]:
    path = shared / BENCH / "livecodebench/sandboxfusion_lcb_v1_sample.decoded.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {
        r["task_id"]: {"inputs": r["inputs"], "outputs": r["outputs"], "fn_name": r["fn_name"]}
        for r in rows
    }


def contest_tests(shared: Path, name_prefix: str) -> list[dict[str, Any]]:
    path = shared / BENCH / "codeforces/sandboxfusion_code_contests_sample.jsonl"
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if json.loads(row["labels"])["name"].startswith(name_prefix):
            tests: list[dict[str, Any]] = json.loads(row["test"])
            return tests[:MAX_TESTS]
    raise AssertionError(f"{name_prefix} not in the CodeContests sample")


def test_livecodebench_good_and_bad_solutions(shared: Path) -> None:
    rows = lcb_rows(shared)
    ids = list(GOOD)
    completions = [fenced(GOOD[i]) for i in ids] + [fenced(BAD[i]) for i in ids]
    tests = [json.dumps(rows[i]) for i in ids] * 2  # data sets often store tests as JSON text
    results = judge_completions(completions, tests, max_tests=MAX_TESTS)
    assert [r.verdict for r in results] == ["accepted"] * 3 + ["wrong_answer"] * 3
    assert code_reward(completions, tests, max_tests=MAX_TESTS) == [1.0] * 3 + [0.0] * 3
    assert REWARDS.get("code") is code_reward


def test_livecodebench_hub_encoded_private_tests(shared: Path) -> None:
    path = shared / BENCH / "livecodebench/sandboxfusion_lcb_v1_sample.jsonl"
    encoded = json.loads(path.read_text().splitlines()[0])["test"]  # base64(zlib(pickle))
    result = judge_program(CARDS_ABC, encoded)
    assert (result.verdict, result.passed, result.total) == ("accepted", 5, 5)


def test_partial_credit_counts_passed_tests(shared: Path) -> None:
    tests = lcb_rows(shared)["atcoder/abc301_a"]
    ties_wrong = TAKAHASHI_AOKI.replace('print("A" if s[-1] == "T" else "T")', 'print("T")')
    result = judge_program(ties_wrong, tests, all_tests=True, max_tests=MAX_TESTS)
    assert result.verdict == "wrong_answer" and len(result.tests) == MAX_TESTS
    assert 0 < result.fraction < 1 and result.reward(partial=True) == result.fraction
    (score,) = code_reward([fenced(ties_wrong)], [tests], partial_credit=True, max_tests=10)
    assert score == pytest.approx(result.fraction)
    stop_early = judge_program(ties_wrong, tests, max_tests=MAX_TESTS)
    assert len(stop_early.tests) == stop_early.passed + 1  # stops at the first failure


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        ("print(undefined_name)", "runtime_error"),
        ("def broken(:\n    pass", "syntax_error"),
        ("import time\ntime.sleep(30)", "timeout"),
        ("import sys\nsys.exit(3)", "runtime_error"),
        ("assert 1 == 2", "runtime_error"),  # its own assert is a crash, not a failed check
        ("eval('1 +')", "runtime_error"),  # a SyntaxError at run time is a crash too
        ("x = [0] * (10**10)", "memory_limit"),
    ],
)
def test_failure_verdicts(shared: Path, code: str, verdict: str) -> None:
    tests = lcb_rows(shared)["codeforces/1873_A"]
    result = judge_program(code, tests, time_limit_s=0.5)
    assert result.verdict == verdict and result.reward() == 0.0


def test_code_contests_problems(shared: Path) -> None:
    shuffle, tshirts = contest_tests(shared, "12_B"), contest_tests(shared, "1000_A")
    assert judge_program(SMALLEST_SHUFFLE, shuffle).verdict == "accepted"
    assert judge_program(TSHIRTS, tshirts).verdict == "accepted"
    off_by_one = TSHIRTS.replace("print(sum(", "print(1 + sum(")
    assert judge_program(off_by_one, tshirts).verdict == "wrong_answer"


def test_leetcode_assert_style_checks(shared: Path) -> None:
    rows = json.loads((shared / BENCH / "code_extra/rllm_leetcode_test.json").read_text())
    tests = rows[0]["tests"]  # {"functional": "def check(candidate): assert ...\ncheck(...)"}
    assert judge_program(MIN_OPERATIONS, tests).verdict == "accepted"
    wrong = MIN_OPERATIONS.replace("return steps", "return steps + 1")
    assert judge_program(wrong, tests).verdict == "wrong_answer"
    early_exit = "import os\nos._exit(0)\n" + MIN_OPERATIONS  # skipping the checks is no pass
    assert judge_program(early_exit, tests).verdict == "runtime_error"


def test_no_code_and_bad_tests_score_zero_without_raising() -> None:
    assert code_reward(["I cannot solve this."], [{"inputs": ["1"], "outputs": ["1"]}]) == [0.0]
    (result,) = judge_completions([fenced("print(1)\n")], ["{not valid"])
    assert result.verdict == "internal_error" and result.reward() == 0.0
    with pytest.raises(ValueError):
        code_reward(["a", "b"], [{"inputs": [], "outputs": []}])
