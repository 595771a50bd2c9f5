"""The `code` reward: 1.0 when the completion's program passes every test (LiveCodeBench)."""

from __future__ import annotations

from functools import partial
from typing import Any

from gspo_cli.rewards.code.judge import JudgeResult, judge_completion
from gspo_cli.rewards.registry import REWARDS
from gspo_cli.sandbox.isolation import checked_mode
from gspo_cli.sandbox.pool import SandboxPool, default_pool


def judge_completions(
    completions: list[str],
    tests: list[Any],
    *,
    pool: SandboxPool | None = None,
    **options: Any,
) -> list[JudgeResult]:
    """Judge each completion against its tests in parallel; options go to judge_program."""
    if len(completions) != len(tests):
        raise ValueError(f"{len(completions)} completions but {len(tests)} test sets")
    # Refuse up front (WeakIsolationError) rather than once per completion.
    options["isolation"] = checked_mode(
        options.get("isolation"), options.get("allow_weak_isolation")
    )
    judge = partial(_judge_pair, options=options)
    return (pool or default_pool()).map(judge, list(zip(completions, tests, strict=True)))


def _judge_pair(pair: tuple[str, Any], options: dict[str, Any]) -> JudgeResult:
    completion, tests = pair
    return judge_completion(str(completion), tests, **options)


@REWARDS.register("code")
def code_reward(
    completions: list[str],
    tests: list[Any],
    *,
    partial_credit: bool = False,
    time_limit_s: float = 6.0,
    memory_limit_mb: int = 1024,
    max_tests: int | None = None,
    judge_pool: SandboxPool | None = None,
) -> list[float]:
    """Per completion: 1.0 if its last code block passes all of `tests[i]` (LiveCodeBench's
    input_output dict, or its JSON string), else 0.0; with `partial_credit`, the fraction of
    tests passed. A hostile or broken program scores 0 and never raises."""
    results = judge_completions(
        completions,
        tests,
        time_limit_s=time_limit_s,
        memory_limit_mb=memory_limit_mb,
        all_tests=partial_credit,
        max_tests=max_tests,
        pool=judge_pool,
    )
    return [r.reward(partial_credit) for r in results]
