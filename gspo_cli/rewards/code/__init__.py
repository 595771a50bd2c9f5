"""Code reward: untrusted programs judged LiveCodeBench/CodeForces-style in a sandbox."""

from gspo_cli.data.testcases import TestCase, TestFormatError, parse_tests
from gspo_cli.rewards.code.compare import compare_json, compare_stdout
from gspo_cli.rewards.code.extract import extract_code
from gspo_cli.rewards.code.isolation import (
    WeakIsolationError,
    allow_weak_isolation,
    available_modes,
    detect_mode,
)
from gspo_cli.rewards.code.judge import (
    VERDICTS,
    JudgePool,
    JudgeResult,
    TestVerdict,
    judge_completion,
    judge_program,
)
from gspo_cli.rewards.code.reward import code_reward, judge_completions
from gspo_cli.rewards.code.sandbox import Limits, RunOutcome, run_program

__all__ = [
    "VERDICTS",
    "JudgePool",
    "JudgeResult",
    "Limits",
    "RunOutcome",
    "TestCase",
    "TestFormatError",
    "TestVerdict",
    "WeakIsolationError",
    "allow_weak_isolation",
    "available_modes",
    "code_reward",
    "compare_json",
    "compare_stdout",
    "detect_mode",
    "extract_code",
    "judge_completion",
    "judge_completions",
    "judge_program",
    "parse_tests",
    "run_program",
]
