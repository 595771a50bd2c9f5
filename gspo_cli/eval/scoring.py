"""Judge a problem's samples: Math-Verify for maths, the code sandbox for code."""

from __future__ import annotations

from dataclasses import dataclass

from gspo_cli.data.problems import Problem
from gspo_cli.rewards.code.reward import judge_completions
from gspo_cli.rewards.extract import last_boxed
from gspo_cli.rewards.math_verifier import MathVerifierPool


@dataclass
class SampleVerdicts:
    correct: list[bool]
    answers: list[str | None]  # maths: the extracted boxed answer; code: None
    verdicts: list[str]  # "correct"/"wrong"/"no_answer" for maths, the judge's verdict for code


def score_samples(
    problem: Problem,
    completions: list[str],
    *,
    math_pool: MathVerifierPool,
    time_limit_s: float = 6.0,
) -> SampleVerdicts:
    if problem.kind == "code":
        if problem.tests is None:
            raise ValueError(f"{problem.id}: a code problem without tests")
        results = judge_completions(
            completions, [problem.tests] * len(completions), time_limit_s=time_limit_s
        )
        verdicts = [r.verdict for r in results]
        return SampleVerdicts(
            [v == "accepted" for v in verdicts], [None] * len(completions), verdicts
        )
    answers = [last_boxed(c) for c in completions]
    scores = math_pool.score(completions, [str(problem.answer)] * len(completions))
    correct = [s >= 1.0 for s in scores]
    verdicts = [
        "no_answer" if a is None else "correct" if ok else "wrong"
        for a, ok in zip(answers, correct, strict=True)
    ]
    return SampleVerdicts(correct, answers, verdicts)
