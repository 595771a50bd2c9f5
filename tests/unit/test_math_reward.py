from __future__ import annotations

from gspo_cli.rewards import REWARDS, last_boxed, math_reward


def test_contract_and_equivalences() -> None:
    completions = [
        "so 3+4=7 and \\boxed{7}",
        "\\boxed{8}",
        "Answer: 7",  # right number, not boxed: the verifier wants \\boxed{}
        "first \\boxed{1} then \\boxed{\\frac{1}{2}}",  # the last box counts
        "\\boxed{0.5}",
        "\\boxed{025}",
    ]
    answers = ["7", "7", "7", "1/2", "\\frac12", "25"]
    assert math_reward(completions, answer=answers, prompt=["ignored"] * 6) == [
        1.0,
        0.0,
        0.0,
        1.0,
        1.0,
        1.0,
    ]
    assert REWARDS.get("math") is math_reward


def test_malformed_answers_score_zero_and_never_raise() -> None:
    nasty = ["\\boxed{", "\\boxed{\\frac{", "\\boxed{" + "(" * 500 + "}", "\\boxed{x^{" * 50, ""]
    assert math_reward(nasty, answer=["1"] * len(nasty)) == [0.0] * len(nasty)


def test_last_boxed_balances_braces() -> None:
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} and \\boxed{2") == "1"
    assert last_boxed("none") is None
