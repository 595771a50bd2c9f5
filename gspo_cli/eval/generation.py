"""Generate and judge: k responses per problem sampled in bounded, seeded batches and judged,
one record per problem. The one code path of `gspo eval` and of training's held-out evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gspo_cli.data import render_prompt
from gspo_cli.data.benchmarks import build_prompt
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import PLAIN, PromptSettings
from gspo_cli.eval.scoring import SampleVerdicts, score_samples
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import RolloutEngine, SamplingParams

SEQUENCES_PER_BATCH = 64  # problems x samples per generate call: bounds memory on small machines


def generate_and_judge(
    engine: RolloutEngine,
    tokenizer: Any,
    problems: list[Problem],
    params: SamplingParams,
    seed: int,
    *,
    math_pool: MathVerifierPool,
    prompt_for: Callable[[Problem], str] = build_prompt,
    prompt_format: PromptSettings = PLAIN,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    skip: set[str] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Sample `params.num_samples` responses per problem and judge them, in bounded batches.

    Each prompt is `prompt_for(problem)` (a conversation: its `messages`), rendered with
    `prompt_format` (data/prompts.py).

    The one code path for `gspo eval` and for periodic evaluation during training. Batches are
    fixed slices of the full problem list, each sampled on a forked RNG seeded by its position:
    a resumed run (`skip` = ids already done) regenerates a partly done batch identically and
    records only its missing problems, and evaluating never changes a training run's RNG.
    """
    per_batch = max(1, SEQUENCES_PER_BATCH // params.num_samples)
    skip = skip or set()
    records: list[dict[str, Any]] = []
    for start in range(0, len(problems), per_batch):
        batch = problems[start : start + per_batch]
        if all(p.id in skip for p in batch):
            continue
        prompts = [
            render_prompt(
                tokenizer,
                list(p.messages) if p.messages is not None else prompt_for(p),
                prompt_format,
                f"{p.benchmark}: problem {p.id}",
                tools=tools,
            )
            for p in batch
        ]
        records_of_batch = _evaluate_batch(engine, batch, prompts, params, seed + start, math_pool)
        for record in records_of_batch:
            if record["id"] in skip:
                continue
            records.append(record)
            if on_done is not None:
                on_done(record)
    return records


def _evaluate_batch(
    engine: RolloutEngine,
    batch: list[Problem],
    prompts: list[list[int]],
    params: SamplingParams,
    seed: int,
    math_pool: MathVerifierPool,
) -> list[dict[str, Any]]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        rollout = engine.generate(prompts, params)
    k = params.num_samples
    records = []
    for i, problem in enumerate(batch):
        texts = rollout.texts[i * k : (i + 1) * k]
        cut = rollout.truncated[i * k : (i + 1) * k]
        verdicts = score_samples(problem, texts, math_pool=math_pool, truncated=cut)
        records.append(
            {
                "id": problem.id,
                "rating": problem.rating,
                "completions": texts,
                "answers": verdicts.answers,
                "verdicts": verdicts.verdicts,
                "correct": verdicts.correct,
                "answered": verdicts.answered,
                **_form_fields(verdicts),
                "lengths": [len(c) for c in rollout.completion_ids[i * k : (i + 1) * k]],
                "truncated": cut,
            }
        )
        if rollout.tool_traces is not None:  # rollout.tools: the calls each sample made
            records[-1]["tool_calls"] = [t.calls for t in rollout.tool_traces[i * k : (i + 1) * k]]
    return records


def _form_fields(verdicts: SampleVerdicts) -> dict[str, list[Any]]:
    """A record's per-sample answer forms: maths' forms and any-form correctness, code's
    clean runs (eval/scoring.py)."""
    fields = {
        "forms": verdicts.forms,
        "correct_any_form": verdicts.correct_any_form,
        "ran_clean": verdicts.ran_clean,
    }
    return {key: value for key, value in fields.items() if value is not None}
