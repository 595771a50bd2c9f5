"""Judge a problem's samples: Math-Verify for maths, the code sandbox for code.

Besides strict correctness, each sample's answer form (rewards/answer_forms.py): whether it
answered in the expected form, and for maths whether its answer in any form is right; for code
whether its program ran clean (no crash or timeout on the tests judged).
"""

from __future__ import annotations

from dataclasses import dataclass

from gspo_cli.data.problems import Problem
from gspo_cli.rewards.answer_forms import BOXED, CODE, answered, any_form_correct, find_answer
from gspo_cli.rewards.code.reward import judge_completions
from gspo_cli.rewards.extract import last_boxed
from gspo_cli.rewards.math_verifier import MathVerifierPool

# Verdicts of a program that ran on every test judged without a crash, timeout or limit: it
# printed an answer, right or wrong (rewards/code/judge.py stops at the first failing test).
RAN_CLEAN = frozenset({"accepted", "wrong_answer"})


@dataclass
class SampleVerdicts:
    correct: list[bool]
    answers: list[str | None]  # maths: the extracted boxed answer; code: None
    verdicts: list[str]  # "correct"/"wrong"/"no_answer" for maths, the judge's verdict for code
    answered: list[bool]  # the answer is in the expected form (maths: boxed; code: a code block)
    forms: list[str | None] | None = None  # maths: the form its answer was found in, or None
    correct_any_form: list[bool] | None = None  # maths: the answer in any form is right
    ran_clean: list[bool] | None = None  # code: ran on every judged test without an error


def score_samples(
    problem: Problem,
    completions: list[str],
    *,
    math_pool: MathVerifierPool,
    time_limit_s: float = 6.0,
    truncated: list[bool] | None = None,
) -> SampleVerdicts:
    """Each completion's verdicts; `truncated[i]`: completion i was cut at the token cap (its
    answer in any form is then a box or a marker only: rewards/answer_forms.py)."""
    if problem.kind == "code":
        if problem.tests is None:
            raise ValueError(f"{problem.id}: a code problem without tests")
        results = judge_completions(
            completions, [problem.tests] * len(completions), time_limit_s=time_limit_s
        )
        verdicts = [r.verdict for r in results]
        return SampleVerdicts(
            [v == "accepted" for v in verdicts],
            [None] * len(completions),
            verdicts,
            [answered(c, CODE) for c in completions],
            ran_clean=[v in RAN_CLEAN for v in verdicts],
        )
    answers = [last_boxed(c) for c in completions]
    golds = [str(problem.answer)] * len(completions)
    scores = math_pool.score(completions, golds)
    correct = [s >= 1.0 for s in scores]
    verdicts = [
        "no_answer" if a is None else "correct" if ok else "wrong"
        for a, ok in zip(answers, correct, strict=True)
    ]
    cut = truncated or [False] * len(completions)
    found = [find_answer(c, t) for c, t in zip(completions, cut, strict=True)]
    return SampleVerdicts(
        correct,
        answers,
        verdicts,
        [answered(c, BOXED) for c in completions],
        [None if f is None else f.form for f in found],
        any_form_correct(completions, golds, correct, math_pool, cut),
    )
