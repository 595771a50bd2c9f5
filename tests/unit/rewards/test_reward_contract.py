"""Rewards held to their contract: N finite numbers per call (None only with `none_as`), one
line naming the function for any breach, exception or timeout; TRL-style signatures; the
working folder importable; per-function means in the metrics."""

from __future__ import annotations

import itertools
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.loader import RecipeError, load_recipe
from gspo_cli.recipe.reward import RewardConfig, RewardFunctionConfig
from gspo_cli.rewards.binding import RewardServices, bind_reward, resolve_reward
from gspo_cli.train.step.rewards import WeightedRewards

USER_REWARDS = """
import re
import time

calls = []


def short(completions):
    return [1.0] * (len(completions) - 1)


def nothing(completions):
    return None


def some_none(completions):
    return [None if i == 2 else 1.0 for i in range(len(completions))]


def strings(completions):
    return ["1.0" for _ in completions]


def infinite(completions):
    return [0.0, float("inf"), 0.0, 0.0]


def not_a_number(completions):
    return [0.0, 0.0, 0.0, float("nan")]


def broken(completions):
    return [1 / len(c[5:]) for c in completions]


def sleeps(completions, *, pid_file: str):
    open(pid_file, "w").write(str(__import__("os").getpid()))
    time.sleep(30)


def backtracks(completions):
    re.match(r"(a+)+$", "a" * 40 + "b")  # C code holding the GIL for hours
    return [0.0] * len(completions)


def length(completions, *, scale: float = 1.0):
    return [scale * len(c) for c in completions]


def trl_style(completions, **kwargs):
    calls.append(sorted(kwargs))
    return [float(len(p) + len(a)) for p, a in zip(kwargs["prompts"], kwargs["answer"])]


def prompts_first(prompts, completions):
    return [1.0 if p.startswith("Q") and c.startswith("A") else 0.0
            for p, c in zip(prompts, completions)]


def prompts_only(prompts, answer):
    return [0.0] * len(prompts)
"""
COMPLETIONS = ["A: one", "A: three", "B: x", "A: four"]
ROWS = [{"prompt": f"Q{i}", "answer": "a" * i, "id": i} for i in range(4)]
_modules = itertools.count()


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """`user("fn")` is the import path of `fn` in a fresh module of USER_REWARDS."""
    module = f"contract_rewards_{next(_modules)}"
    (tmp_path / f"{module}.py").write_text(USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda fn: f"{module}:{fn}"
    sys.modules.pop(module, None)


def _model(*functions: RewardFunctionConfig, timeout_s: float = 5.0) -> WeightedRewards:
    return WeightedRewards(
        RewardConfig(functions=list(functions), timeout_s=timeout_s), RewardServices()
    )


def _error(model: WeightedRewards) -> str:
    try:
        with pytest.raises(GspoError) as info:
            model(COMPLETIONS, ROWS)
    finally:
        model.close()
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize(
    ("fn", "problem"),
    [
        ("short", "returned 3 scores for 4 completions"),
        ("nothing", "returned None, not a list of 4 scores"),
        ("some_none", "score 2 is None; to allow None, give this reward `none_as: 0.0`"),
        ("strings", "score 0 is '1.0' (str), not a number (float, int or bool)"),
        ("infinite", "score 1 is inf; scores must be finite"),
        ("not_a_number", "score 3 is nan; scores must be finite"),
        ("broken", "raised ZeroDivisionError: division by zero (at contract_rewards_"),
    ],
)
def test_a_broken_contract_is_one_line_naming_the_function(
    user: Callable[[str], str], fn: str, problem: str
) -> None:
    message = _error(_model(RewardFunctionConfig(name=user(fn))))
    assert message.startswith(f"reward '{user(fn)}': {problem}"), message


def test_none_counts_only_as_the_recipe_says(user: Callable[[str], str]) -> None:
    for none_as, total in ((0.5, 0.5), ("skip", 0.0)):
        model = _model(RewardFunctionConfig(name=user("some_none"), none_as=none_as))
        totals, correct, metrics = model(COMPLETIONS, ROWS)[:3]
        assert totals == [1.0, 1.0, total, 1.0] and correct == [1.0, 1.0, 0.0, 1.0]
        # skip: the completion is not scored, so it is left out of the function's mean
        expected = 1.0 if none_as == "skip" else 3.5 / 4
        assert metrics == {"reward/some_none/mean": pytest.approx(expected)}
        model.close()


def test_none_as_is_a_finite_number_or_skip(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    for value, problem in (
        ("skp", "reward.functions.0.none_as: a finite number or skip (got 'skp')"),
        (".inf", "reward.functions.0.none_as: a finite number or skip (got inf)"),
    ):
        recipe.write_text(f"reward:\n  functions: [{{name: math, none_as: {value}}}]\n")
        with pytest.raises(RecipeError) as info:
            load_recipe(recipe)
        assert info.value.problems == [problem]
    recipe.write_text("reward:\n  functions: [{name: math, weight: .inf}]\n")
    with pytest.raises(
        RecipeError, match=r"reward\.functions\.0\.weight: Input should be a finite"
    ):
        load_recipe(recipe)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_hanging_user_reward_is_stopped_at_its_deadline(
    user: Callable[[str], str], tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    options = {"pid_file": str(pid_file)}
    model = _model(RewardFunctionConfig(name=user("sleeps"), options=options), timeout_s=0.25)
    message = _error(model)
    assert message == (
        f"reward '{user('sleeps')}': no result within 1s (reward.timeout_s 0.25s x 4 "
        "completions); its worker was stopped"
    )
    pid = int(pid_file.read_text())
    assert pid != os.getpid()
    for _ in range(100):  # the kill is asynchronous: the process goes within moments
        if not _alive(pid):
            break
        time.sleep(0.05)
    assert not _alive(pid)


def test_even_c_code_that_holds_the_gil_is_stopped(user: Callable[[str], str]) -> None:
    message = _error(_model(RewardFunctionConfig(name=user("backtracks")), timeout_s=0.05))
    assert "no result within 0.2s" in message


def test_a_user_reward_keeps_working_after_many_calls(user: Callable[[str], str]) -> None:
    """One worker process serves every call; options reach it."""
    model = _model(RewardFunctionConfig(name=user("length"), options={"scale": 2}))
    for _ in range(3):
        totals, _, metrics = model(COMPLETIONS, ROWS)[:3]
        assert totals == [12.0, 16.0, 8.0, 14.0] and metrics == {"reward/length/mean": 12.5}
    model.close()


def test_trl_style_rewards_get_prompts_and_every_column(user: Callable[[str], str]) -> None:
    bound = bind_reward(user("trl_style"), {}, RewardServices())
    args, kwargs = bound.arguments(COMPLETIONS, ROWS, [[1], [2], [3], [4]])
    assert args == [] and sorted(kwargs) == [
        "answer", "completion_ids", "completions", "id", "prompts"
    ]  # fmt: skip
    assert kwargs["prompts"] == ["Q0", "Q1", "Q2", "Q3"] and kwargs["id"] == [0, 1, 2, 3]
    model = _model(RewardFunctionConfig(name=user("trl_style")))
    totals, _, _ = model(COMPLETIONS, ROWS)[:3]
    assert totals == [2.0, 3.0, 4.0, 5.0]
    model.close()
    # **kwargs takes data, never a knob: an option must still be a keyword-only parameter
    with pytest.raises(ValueError, match="has no option 'scale'; its options: none"):
        RewardFunctionConfig(name=user("trl_style"), options={"scale": 2})


def test_a_first_parameter_named_prompts_gets_the_prompts(user: Callable[[str], str]) -> None:
    model = _model(RewardFunctionConfig(name=user("prompts_first")))
    totals, _, _ = model(COMPLETIONS, ROWS)[:3]
    assert totals == [1.0, 1.0, 0.0, 1.0]
    model.close()
    with pytest.raises(ValueError, match="no parameter takes the completions \\('prompts' is not"):
        RewardFunctionConfig(name=user("prompts_only"))


def test_the_working_folder_is_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `gspo` (the console script) runs: its import path does not start at the working
    folder, which `python -m` would add."""
    (tmp_path / "folder_rewards.py").write_text(
        textwrap.dedent("""
        def shorter(completions):
            return [1.0 / (1 + len(c)) for c in completions]
        """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "folder_rewards", raising=False)
    assert resolve_reward("folder_rewards:shorter")(["ab"]) == [1.0 / 3]
    with pytest.raises(ValueError, match=re.escape(f"looked in the working folder {tmp_path}")):
        resolve_reward("no_such_rewards:f")


def test_each_function_has_its_mean_in_the_metrics(user: Callable[[str], str]) -> None:
    model = _model(
        RewardFunctionConfig(name=user("length"), weight=0.5),
        RewardFunctionConfig(name=user("prompts_first"), weight=2.0),
    )
    totals, _, metrics = model(COMPLETIONS, ROWS)[:3]
    assert totals == [5.0, 6.0, 2.0, 5.5]
    assert metrics == {"reward/length/mean": 6.25, "reward/prompts_first/mean": 0.75}
    model.close()


def test_metric_labels_are_short_and_unique() -> None:
    from gspo_cli.train.step.rewards import metric_labels

    def entry(name: str) -> Any:
        return RewardFunctionConfig.model_construct(name=name)

    names = ["math", "a.rewards:length", "b.rewards:length", "pkg.mod.fmt", "math"]
    assert metric_labels([entry(n) for n in names]) == [
        "math", "a.rewards:length", "b.rewards:length", "fmt", "math#2"
    ]  # fmt: skip
