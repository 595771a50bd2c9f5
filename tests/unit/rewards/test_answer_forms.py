"""The answer-form rules (rewards/answer_forms.py): where a completion's final answer is, in
which form, whether it answered in the expected form, and whether it is right in any form by
Math-Verify; and the eval scoring that records them per sample."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gspo_cli.data.problems import Problem
from gspo_cli.data.testcases import parse_tests
from gspo_cli.eval.scoring import score_samples
from gspo_cli.rewards.answer_forms import (
    BOXED,
    CODE,
    MARKER,
    NUMBER,
    FoundAnswer,
    answered,
    any_form_correct,
    find_answer,
)
from gspo_cli.rewards.math_verifier import MathVerifierPool


@pytest.fixture(scope="module")
def pool() -> Iterator[MathVerifierPool]:
    with MathVerifierPool(1, 5.0) as verifier:
        yield verifier


@pytest.mark.parametrize(
    "completion,expected",
    [
        # several boxes: the last one counts
        ("First \\boxed{3}, no wait: \\boxed{5}", FoundAnswer("5", BOXED)),
        # nested braces inside the box
        ("so \\boxed{\\frac{1}{2}}.", FoundAnswer("\\frac{1}{2}", BOXED)),
        # an empty box is no answer: the search goes on to the text
        ("It is 7. \\boxed{}", FoundAnswer("7", NUMBER)),
        # a box beats a later marker and later numbers
        ("\\boxed{4}\nAnswer: 9, and 11", FoundAnswer("4", BOXED)),
        # the marker beats a bare number in a check after it
        ("Answer: 42. Check: 6*7=42, 3 steps", FoundAnswer("42", MARKER)),
        ("The answer is 12 cm.", FoundAnswer("12", MARKER)),
        ("**Final Answer**: $\\frac{3}{4}$", FoundAnswer("\\frac{3}{4}", MARKER)),
        ("answer: 3\nThe final answer is 8.", FoundAnswer("8", MARKER)),  # the last marker
        ("The answer is 42 because 6*7=42.", FoundAnswer("42", MARKER)),
        ("Answer: 5 \\text{ cm}", FoundAnswer("5", MARKER)),
        # "answer" without a colon or "is" is not a marker
        ("the answer depends on x; here 4", FoundAnswer("4", NUMBER)),
        # the final number: thousands, negatives, decimals, fractions, units after it
        ("so 1,234 apples", FoundAnswer("1234", NUMBER)),
        ("x = -3", FoundAnswer("-3", NUMBER)),
        ("temperature \u22124 degrees", FoundAnswer("-4", NUMBER)),
        ("5-3 is what we need", FoundAnswer("3", NUMBER)),  # a subtraction, not -3
        ("it takes 2.5 hours", FoundAnswer("2.5", NUMBER)),
        ("we get 3/4 of it", FoundAnswer("3/4", NUMBER)),
        ("we get \\frac{3}{4}", FoundAnswer("\\frac{3}{4}", NUMBER)),
        ("it measures 12cm", FoundAnswer("12", NUMBER)),
        ("no answer at all", None),
    ],
)
def test_find_answer(completion: str, expected: FoundAnswer | None) -> None:
    assert find_answer(completion) == expected


def test_answered_is_the_expected_form_only() -> None:
    assert answered("so \\boxed{ 2 }", BOXED)
    assert not answered("so \\boxed{}", BOXED)  # an empty box
    assert not answered("so \\boxed{  }", BOXED)
    assert not answered("Answer: 2", BOXED)  # right form for a grader, not the expected one
    assert answered("Answer: 2", MARKER) and not answered("2", MARKER)
    assert answered("2", NUMBER) and not answered("two", NUMBER)
    assert answered("```python\nprint(1)\n```", CODE)
    assert not answered("print(1)", CODE)  # no code block: the judge runs nothing
    assert not answered("```cpp\nint main(){}\n```", CODE)  # not Python
    with pytest.raises(ValueError, match="unknown answer form"):
        answered("2", "latex")


def test_any_form_correct_by_math_verify(pool: MathVerifierPool) -> None:
    cases = [
        ("Answer: 1/2", "0.5", True),  # a fraction against a decimal
        ("It is 0.5", "\\frac{1}{2}", True),  # a decimal against LaTeX \frac
        ("we get \\frac{3}{4}", "0.75", True),
        ("The answer is 12 cm.", "12", True),  # a unit after the number
        ("so 1,234 apples", "1234", True),
        ("Answer: 41", "42", False),
        ("Answer: 42. Check: 6*7=42, 3 steps", "42", True),  # not the trailing 3
        ("no answer at all", "42", False),
        ("Answer: }5{", "5", False),  # unbalanced braces cannot be boxed: not read
    ]
    got = any_form_correct(
        [c for c, _, _ in cases], [g for _, g, _ in cases], [False] * len(cases), pool
    )
    assert got == [want for _, _, want in cases]


def test_a_boxed_answer_keeps_the_strict_verdict(pool: MathVerifierPool) -> None:
    # the last box is the strict reward's check: its verdict is taken as it is, not re-checked
    completions = ["\\boxed{5}", "\\boxed{5}", "\\boxed{}  Answer: 5"]
    assert any_form_correct(completions, ["5", "5", "5"], [True, False, False], pool) == [
        True,
        False,  # the strict verdict said wrong: any form does not overrule the same check
        True,  # the box is empty: the marker's answer is checked
    ]


def test_score_samples_records_forms_for_maths(pool: MathVerifierPool) -> None:
    problem = Problem(id="p", benchmark="b", kind="math", question="Q", answer="0.5")
    completions = ["\\boxed{1/2}", "Answer: 1/2", "roughly 0.5", "\\boxed{}", "Answer: 2"]
    verdicts = score_samples(problem, completions, math_pool=pool)
    assert verdicts.correct == [True, False, False, False, False]
    assert verdicts.answered == [True, False, False, False, False]
    assert verdicts.forms == [BOXED, MARKER, NUMBER, None, MARKER]
    assert verdicts.correct_any_form == [True, True, True, False, False]
    assert verdicts.ran_clean is None


def test_score_samples_records_answered_and_ran_clean_for_code(pool: MathVerifierPool) -> None:
    tests = tuple(parse_tests([{"input": "2 3\n", "output": "5\n"}]))
    problem = Problem(id="c", benchmark="b", kind="code", question="Q", answer=None, tests=tests)
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)",  # accepted
        "print(4)",  # wrong answer: it ran clean
        "raise SystemExit(3)",  # runtime error
        "while True: pass",  # timeout
    ]
    completions = [f"```python\n{p}\n```" for p in programs] + ["no code here"]
    verdicts = score_samples(problem, completions, math_pool=pool, time_limit_s=1.0)
    assert verdicts.verdicts == ["accepted", "wrong_answer", "runtime_error", "timeout", "no_code"]
    assert verdicts.correct == [True, False, False, False, False]
    assert verdicts.answered == [True, True, True, True, False]
    assert verdicts.ran_clean == [True, True, False, False, False]
    assert verdicts.correct_any_form is None and verdicts.forms is None


def test_a_cut_response_is_read_for_boxes_and_markers_only(pool: MathVerifierPool) -> None:
    # cut at the cap mid-sentence: its last number is where the cap fell, not an answer
    completions = ["so 3 + 4 = 7 and then 12", "Answer: 12. Now the next", "\\boxed{12} and 7"]
    assert find_answer(completions[0], truncated=True) is None
    assert find_answer(completions[0]) == FoundAnswer("12", NUMBER)
    right = any_form_correct(completions, ["12"] * 3, [False, False, True], pool, [True] * 3)
    assert right == [False, True, True]  # the marker and the box still count
    problem = Problem(id="p", benchmark="b", kind="math", question="Q", answer="12")
    verdicts = score_samples(problem, completions[:1], math_pool=pool, truncated=[True])
    assert verdicts.correct_any_form == [False] and verdicts.forms == [None]
    assert score_samples(problem, completions[:1], math_pool=pool).correct_any_form == [True]
