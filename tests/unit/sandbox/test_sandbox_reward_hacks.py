"""Reward hacks: a wrong program that attacks the judge must score 0, a right one still 1.

Each attack is written against the weak points of a judge that runs the check in the
program's interpreter (patched builtins, answers with their own __eq__, a forged status line,
frames that lead to the harness's secrets, an early exit). Checked in every isolation mode
this machine offers, for assert-style (`functional`) and call-based tests.
"""

from __future__ import annotations

import pytest

from gspo_cli.rewards.code import code_reward, judge_program
from gspo_cli.sandbox import isolation as iso
from gspo_cli.sandbox.program import Limits

# The container stage of CI runs these too: the judge's defences under its isolation.
pytestmark = pytest.mark.container

MODES = iso.available_modes()
FAST = Limits(time_limit_s=2.0)
RIGHT = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b\n"
WRONG = RIGHT.replace("return a + b", "return a + b + 1")
CHECK = {
    "functional": "def check(candidate):\n    assert candidate(a=1, b=2) == 3\n"
    "    assert candidate(a=5, b=-5) == 0\n\n\ncheck(Solution().add)"
}
CALL = {"inputs": ["1\n2", "5\n-5"], "outputs": ["3", "0"], "fn_name": "add"}

PATCH_BUILTINS = """
import builtins, sys
_compile = builtins.compile
builtins.compile = lambda *a, **k: _compile("pass", "x", "exec")
builtins.AssertionError = type("AssertionError", (Exception,), {})
harness = sys.modules["__main__"]  # the runner: reassign its globals, as the old attack did
for name in ("check_program", "exited", "failure", "run_main"):
    if hasattr(harness, name):
        setattr(harness, name, lambda *a, **k: {"status": "ok"})
"""
FAKE_STATUS = """
import sys
for text in ("{'status': 'ok'}", '{"status": "ok"}', "ok", "accepted"):
    print(text)
    print(text, file=sys.stderr)
"""
# Climb every frame and look through every object for the harness's secrets: a status
# descriptor to forge a verdict on, and the check's source to read the expected answers from.
FRAME_THEFT = """
import gc, os, re, sys
EXPECTED = {}
def _steal(value):
    if isinstance(value, str) and "def check" in value:
        for a, b, out in re.findall(r"a=(-?\\d+), b=(-?\\d+)\\) == (-?\\d+)", value):
            EXPECTED[int(a), int(b)] = int(out)
    if isinstance(value, dict):
        for key, item in list(value.items()):
            if key in ("status_fd", "status") and isinstance(item, int):
                try:
                    os.write(item, b"{'status': 'ok'}")
                except OSError:
                    pass
            _steal(item)
try:
    frame = sys._getframe()
    while frame is not None:
        _steal(dict(frame.f_locals))
        frame = frame.f_back
    for obj in gc.get_objects():
        _steal(obj)
except Exception:
    pass
"""
# Reach into the parent (the checker) through /proc and write a verdict on its descriptors.
CHECKER_FDS = """
import os
for fd in range(3, 64):
    try:
        with open(f"/proc/{os.getppid()}/fd/{fd}", "w") as f:
            f.write("{'status': 'ok'}")
    except OSError:
        pass
"""
ALWAYS_EQUAL = """
class _Yes:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
class _Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
"""


def solution(right: bool, attack: str) -> str:
    """The attack's code, then Solution.add (right, or off by one) wired through it."""
    body = "a + b" if right else "a + b + 1"
    if attack == "always_equal":
        body = f"_Int({body})" if right else "_Yes()"
    if attack == "frame_theft" and not right:
        body = "EXPECTED.get((a, b), a + b + 1)"
    if attack == "exit_in_call":
        body = f"__import__('os')._exit(0) or ({body})"
    code = {
        "patch_builtins": PATCH_BUILTINS,
        "fake_status": FAKE_STATUS,
        "frame_theft": FRAME_THEFT,
        "always_equal": ALWAYS_EQUAL,
        "checker_fds": CHECKER_FDS,
    }.get(attack, "")
    return f"{code}\nclass Solution:\n    def add(self, a, b):\n        return {body}\n"


def options(mode: str) -> dict[str, object]:
    return {"limits": FAST, "isolation": mode, "allow_weak_isolation": mode != "bwrap"}


ATTACKS = ["patch_builtins", "fake_status", "frame_theft", "always_equal", "checker_fds"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", ATTACKS)
def test_assert_checks_cannot_be_fooled(mode: str, attack: str) -> None:
    assert judge_program(solution(False, attack), CHECK, **options(mode)).reward() == 0.0
    assert judge_program(solution(True, attack), CHECK, **options(mode)).verdict == "accepted"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", ATTACKS)
def test_call_based_tests_cannot_be_fooled(mode: str, attack: str) -> None:
    assert judge_program(solution(False, attack), CALL, **options(mode)).reward() == 0.0
    assert judge_program(solution(True, attack), CALL, **options(mode)).verdict == "accepted"


@pytest.mark.parametrize("mode", MODES)
def test_exiting_early_is_no_pass(mode: str) -> None:
    early = "import os\nos._exit(0)\n" + WRONG
    for program in (early, solution(True, "exit_in_call"), solution(False, "exit_in_call")):
        for tests in (CHECK, CALL):
            result = judge_program(program, tests, **options(mode))
            assert result.verdict == "runtime_error", (program, tests)
    assert judge_program(RIGHT, CHECK, **options(mode)).verdict == "accepted"


@pytest.mark.parametrize("mode", MODES)
def test_writing_to_every_descriptor_forges_nothing(mode: str) -> None:
    spray = (
        "import os\nfor fd in range(3, 1024):\n    try:\n"
        "        os.write(fd, b\"{'status': 'ok'}\\n\")\n    except OSError:\n        pass\n"
    )
    for tests in (CHECK, CALL):
        assert judge_program(spray + WRONG, tests, **options(mode)).reward() == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_the_check_uses_the_real_builtins_and_header_modules(mode: str) -> None:
    check = {
        "functional": "def check(candidate):\n"
        "    assert sorted(candidate([3, 1, 2])) == [1, 2, 3]\n"
        "    assert math.isclose(candidate([0.5])[0], 0.5)\n\ncheck(Solution().f)"
    }
    right = "class Solution:\n    def f(self, xs):\n        return xs\n"
    shadow = (
        "import math\nmath.isclose = lambda *a, **k: True\n"
        "def sorted(xs):\n    return [1, 2, 3]\n"
        "class Solution:\n    def f(self, xs):\n        return [9]\n"
    )
    assert judge_program(right, check, **options(mode)).verdict == "accepted"
    assert judge_program(shadow, check, **options(mode)).reward() == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_in_place_changes_to_arguments_are_seen_by_the_check(mode: str) -> None:
    check = {
        "functional": "def check(candidate):\n    nums = [3, 1, 2]\n    candidate(nums)\n"
        "    assert nums == [1, 2, 3]\n\ncheck(Solution().sortInPlace)"
    }
    right = "class Solution:\n    def sortInPlace(self, nums):\n        nums.sort()\n"
    wrong = "class Solution:\n    def sortInPlace(self, nums):\n        nums.reverse()\n"
    assert judge_program(right, check, **options(mode)).verdict == "accepted"
    assert judge_program(wrong, check, **options(mode)).verdict == "wrong_answer"


def test_code_reward_scores_the_hacks_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "_allow_weak", True)  # as reward.sandbox.allow_weak_isolation
    fenced = [f"```python\n{solution(False, a)}```" for a in ATTACKS]
    fenced.append(f"```python\n{RIGHT}```")
    scores = code_reward(fenced, [CHECK] * len(fenced), time_limit_s=2.0)
    assert scores == [0.0] * len(ATTACKS) + [1.0]
