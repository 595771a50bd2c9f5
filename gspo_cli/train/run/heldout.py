"""Held-out accuracy during training, through the same code path as `gspo eval`."""

from __future__ import annotations

from typing import Any

from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import PromptSettings
from gspo_cli.data.testcases import parse_tests
from gspo_cli.eval.generation import generate_and_judge
from gspo_cli.eval.summary import FORM_METRICS, summarize
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import RolloutEngine, SamplingParams


def rows_as_problems(rows: list[dict[str, Any]]) -> list[Problem]:
    """Held-out rows as eval Problems: code when the row carries tests, maths otherwise. The
    question is the row's prompt as it is (a conversation: its turns, in `messages`), rendered
    at evaluation exactly as training renders it (`heldout_accuracy`'s `prompt_format`)."""
    problems = []
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        turns = None if isinstance(prompt, str) else tuple(prompt)
        users = [t["content"] for t in turns or () if t["role"] == "user"]
        problems.append(
            Problem(
                id=str(row.get("id", i)),
                benchmark="heldout",
                kind="code" if row.get("tests") is not None else "math",
                question=prompt if turns is None else (users or [""])[-1],
                answer=None if row.get("answer") is None else str(row["answer"]),
                tests=None if row.get("tests") is None else tuple(parse_tests(row["tests"])),
                messages=turns,
            )
        )
    return problems


def heldout_accuracy(
    engine: RolloutEngine,
    tokenizer: Any,
    problems: list[Problem],
    params: SamplingParams,
    seed: int,
    math_pool: MathVerifierPool,
    prompt_format: PromptSettings,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """avg@k accuracy, the answer forms beside it (answered; accuracy in any form for maths,
    clean runs for code), share of problems solved at least once (pass@k), response statistics."""
    records = generate_and_judge(
        engine,
        tokenizer,
        problems,
        params,
        seed,
        math_pool=math_pool,
        prompt_for=lambda p: p.question,
        prompt_format=prompt_format,
        tools=tools,  # a chat template's tool calls: prompts show the tools, as in training
    )
    k = params.num_samples
    metrics = summarize(records, k, problems[0].kind, seed)
    forms = {  # answered, accuracy_any_form (maths), ran_clean (code): docs/evaluation.md
        f"{name}{suffix}": metrics[name][key]
        for name in FORM_METRICS.values()
        if name in metrics
        for suffix, key in (("", "value"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high"))
    }
    return {
        "accuracy": metrics[f"avg@{k}"]["value"],
        "accuracy_ci_low": metrics[f"avg@{k}"]["ci_low"],
        "accuracy_ci_high": metrics[f"avg@{k}"]["ci_high"],
        **forms,
        "solved_any": metrics[f"pass@{k}"]["value"],
        "response_len_mean": metrics["response_len_mean"],
        "truncated_frac": metrics["truncated_frac"],
        "num_problems": float(len(problems)),
        "samples": float(k),
    }
