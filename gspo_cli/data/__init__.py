"""Data: problems and benchmarks, file and hub readers, row formats, test cases, built-in tasks,
prompts.

Imports no torch and nothing of `eval/` or `train/` (a test checks this).
"""

from gspo_cli.data.arithmetic import arithmetic_split, make_problem
from gspo_cli.data.benchmarks import BENCHMARKS, build_prompt, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import render_prompt
from gspo_cli.data.sources import load_rows
from gspo_cli.data.testcases import TestCase, TestFormatError, parse_tests

__all__ = [
    "BENCHMARKS",
    "Problem",
    "TestCase",
    "TestFormatError",
    "arithmetic_split",
    "build_prompt",
    "load_benchmark",
    "load_rows",
    "make_problem",
    "parse_tests",
    "render_prompt",
]
