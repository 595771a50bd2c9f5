from __future__ import annotations

import time

import pytest

from gspo_cli.rewards import REWARDS, last_boxed, math_reward, math_verifier
from gspo_cli.rewards.math_verifier import MathVerifierPool, check_answer


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
    with MathVerifierPool(1, 5.0) as pool:
        scores = math_reward(completions, answers, math_pool=pool)
    assert scores == [
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
    with MathVerifierPool(1, 5.0) as pool:
        assert math_reward(nasty, ["1"] * len(nasty), math_pool=pool) == [0.0] * len(nasty)


def test_last_boxed_balances_braces() -> None:
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} and \\boxed{2") == "1"
    assert last_boxed("none") is None


def _sometimes_hangs(completion: str, gold: str, timeout_s: float = 5.0) -> float:
    """Module level so that the worker processes can unpickle it."""
    if "hang" in completion:
        time.sleep(60)
    return check_answer(completion, gold, timeout_s)


@pytest.mark.slow
def test_a_hung_check_scores_zero_and_the_others_are_still_scored(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(math_verifier, "check_answer", _sometimes_hangs)
    monkeypatch.setattr(math_verifier, "OUTER_DEADLINE_FACTOR", 0.0)
    monkeypatch.setattr(math_verifier, "OUTER_DEADLINE_SLACK_S", 3.0)  # deadline = 3 s, not 5
    pool = MathVerifierPool(num_workers=1, timeout_s=1.0)
    try:
        completions = ["\\boxed{1}", "hang \\boxed{2}", "\\boxed{3}", "\\boxed{4}", "\\boxed{5}"]
        assert pool.score(completions, ["1", "2", "3", "0", "5"]) == [1.0, 0.0, 1.0, 0.0, 1.0]
    finally:
        pool.close()
