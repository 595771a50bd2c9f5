"""The `judge` reward as a recipe names it: its options, checked when the recipe loads.

    reward:
      functions:
        - name: judge
          none_as: skip            # what on_parse_failure / on_error `skip` return
          options: {model: http://localhost:8000/v1, mode: group, on_error: skip}

docs/judges.md has every option. Checked at validate time: the model (a built-in's name, a URL's
form, a checkpoint's config), the template's placeholders for its mode, the parse rule, the
score range, and that a judge which may skip is on an entry that allows None.
"""

from __future__ import annotations

import inspect
import math
import typing
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.contract import NoneAs, options_checked_by, takes_structured_answers
from gspo_cli.rewards.judges.backends import BUILTIN_PREFIX, check_judge_model
from gspo_cli.rewards.judges.reward import Judge
from gspo_cli.rewards.judges.spec import (
    DEFAULT_PARSE,
    DEFAULT_TEMPLATES,
    ScoreReader,
    check_parse,
    check_template,
)
from gspo_cli.rewards.registry import REWARDS, RewardFn
from gspo_cli.rewards.validated import AtLeastOne, Positive, checked_str_schema

CONCURRENCY, TIMEOUT_S, NEW_TOKENS = AtLeastOne(4), Positive(30.0), AtLeastOne(64)  # defaults
_JUDGES: dict[tuple[Any, ...], Judge] = {}  # options -> Judge: built once per process


class JudgeModel(str):
    """`builtin:NAME`, an http(s) URL or a causal LM checkpoint (`check_judge_model`)."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return checked_str_schema(check_judge_model)


def make_judge(options: dict[str, Any]) -> Judge:
    """A Judge from `judge_reward`'s options (defaults filled); ValueError for options that do
    not fit together."""
    given = {**_defaults(), **options}
    key = tuple(sorted((k, repr(v)) for k, v in given.items()))
    if key in _JUDGES:
        return _JUDGES[key]
    mode = given["mode"]
    template = check_template(given["template"] or DEFAULT_TEMPLATES[mode], mode)
    if len(given["score_range"]) != 2:
        raise ValueError(f"score_range {given['score_range']} is not [low, high]")
    low, high = (float(v) for v in given["score_range"])
    if not low < high:
        raise ValueError(f"score_range [{low:g}, {high:g}] must rise")
    fallback = given["on_parse_failure"]
    if fallback != "skip" and not math.isfinite(float(fallback)):
        raise ValueError(f"on_parse_failure {fallback!r} must be skip or a finite number")
    judge = Judge(
        model=str(given["model"]),
        template=template,
        reader=ScoreReader(check_parse(given["parse"] or DEFAULT_PARSE[mode]), low, high),
        mode=mode,
        on_parse_failure=given["on_parse_failure"],
        on_error=given["on_error"],
        max_concurrency=int(given["max_concurrency"]),
        timeout_s=float(given["timeout_s"]),
        max_new_tokens=int(given["max_new_tokens"]),
        api_model=given["api_model"],
        api_key_env=given["api_key_env"],
    )
    _JUDGES[key] = judge
    return judge


def may_skip(judge: Judge) -> bool:
    """Whether the judge may return None (a skip rule on a judge that can fail)."""
    if judge.model.startswith(BUILTIN_PREFIX):
        return False  # a rule: no parse, no call to fail
    return judge.on_parse_failure == "skip" or judge.on_error == "skip"


def check_judge_options(options: dict[str, Any], none_as: NoneAs) -> None:
    """The options together (one line, exit 2, when the recipe loads)."""
    try:
        judge = make_judge(options)
    except ValueError as exc:
        raise ValueError(f"reward 'judge': {exc}") from None
    if may_skip(judge) and none_as is None:
        raise ValueError(
            "reward 'judge': on_parse_failure or on_error skip returns None for what it skips; "
            "set none_as: skip on this entry (or give on_parse_failure a number and "
            "on_error: fail)"
        )


@options_checked_by(check_judge_options)
@takes_structured_answers  # a reference answer is only read as text (builtin:overlap)
def judge_reward(
    completions: list[str],
    prompts: list[Any],
    *,
    model: JudgeModel,
    template: str | None = None,
    parse: str | None = None,
    mode: Literal["pointwise", "group"] = "pointwise",
    score_range: list[float] = [0.0, 10.0],  # noqa: B006 (read, never changed)
    on_parse_failure: Literal["skip"] | float = "skip",
    on_error: Literal["skip", "fail"] = "fail",
    max_concurrency: AtLeastOne = CONCURRENCY,
    timeout_s: Positive = TIMEOUT_S,
    max_new_tokens: AtLeastOne = NEW_TOKENS,
    api_model: str = "default",
    api_key_env: str | None = None,
    reward_context: RewardContext | None = None,
    **columns: Any,
) -> list[float | None]:
    """Scores in [0, 1] by the judge, None where a skip rule applies (module docstring)."""
    options = {k: v for k, v in locals().items() if k in _defaults() or k == "model"}
    judge = make_judge(options)
    answers = columns.get("answer") or [None] * len(completions)
    return judge.score(completions, prompts, answers, reward_context or RewardContext())


# registered here: it may return None (skips), which the registry's type does not say
REWARDS.register("judge")(typing.cast(RewardFn, judge_reward))


def _defaults() -> dict[str, Any]:
    parameters = inspect.signature(judge_reward).parameters.values()
    return {
        p.name: p.default
        for p in parameters
        if p.kind == p.KEYWORD_ONLY and p.default is not p.empty and p.name != "reward_context"
    }
