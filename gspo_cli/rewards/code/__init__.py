"""Code reward: untrusted programs judged LiveCodeBench/CodeForces-style in the sandbox
(gspo_cli.sandbox)."""

from gspo_cli.data.testcases import TestCase, TestFormatError, parse_tests
from gspo_cli.rewards.code.compare import compare_json, compare_stdout
from gspo_cli.rewards.code.extract import extract_code
from gspo_cli.rewards.code.judge import (
    VERDICTS,
    JudgeResult,
    TestVerdict,
    judge_completion,
    judge_program,
)
from gspo_cli.rewards.code.reward import code_reward, judge_completions

__all__ = [
    "VERDICTS",
    "JudgeResult",
    "TestCase",
    "TestFormatError",
    "TestVerdict",
    "code_reward",
    "compare_json",
    "compare_stdout",
    "extract_code",
    "judge_completion",
    "judge_completions",
    "judge_program",
    "parse_tests",
]
