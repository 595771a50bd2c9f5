"""The held-out judge (`reward.heldout_judge`): every N steps, responses to the held-out prompts
scored by it and by the training judge, logged side by side (`judge_heldout/mean`,
`judge_train/mean`). The training judge's score rising while the held-out one falls is judge
hacking; `gspo compare` plots both."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gspo_cli.core.errors import GspoError
from gspo_cli.eval.generation import generate_and_judge
from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.judges import make_judge
from gspo_cli.rewards.judges.reward import ERRORS, PARSE_FAILURES
from gspo_cli.train.run.problem_sets import eval_format, eval_params, tool_prompts

if TYPE_CHECKING:
    from gspo_cli.train.run.prepare import PreparedRun

SEED_OFFSET = 11  # its own samples: not the held-out accuracy's (seed + 7)


def judge_heldout(run: PreparedRun, step: int) -> dict[str, float]:
    """`judge_heldout/mean` and `judge_train/mean` (when a `judge` reward trains) at the steps
    `every` names and the last; {} at others. A judge error with `on_error: fail` is one line."""
    recipe = run.recipe
    cfg = recipe.reward.heldout_judge
    if cfg is None or (step % cfg.every != 0 and step != recipe.trainer.steps):
        return {}
    params = eval_params(recipe)
    records = generate_and_judge(
        run.step_environments[0].rollout,  # validation: one environment with a held-out judge
        run.tokenizer,
        run.eval_problems,
        params,
        recipe.trainer.seed + SEED_OFFSET,
        math_pool=run.math_pool,
        prompt_for=lambda p: p.question,
        prompt_format=eval_format(recipe),
        tools=tool_prompts(recipe),
    )
    problems = {p.id: p for p in run.eval_problems}
    completions: list[str] = []
    prompts: list[Any] = []
    answers: list[Any] = []
    for record in records:  # a problem's samples stay together: group judges see its group
        problem = problems[record["id"]]
        prompt = list(problem.messages) if problem.messages is not None else problem.question
        completions += record["completions"]
        prompts += [prompt] * len(record["completions"])
        answers += [problem.answer] * len(record["completions"])
    training = [f for f in recipe.reward.functions if f.name == "judge"]
    judges = {
        "judge_heldout": cfg.options,
        **({"judge_train": training[0].options} if training else {}),
    }
    metrics: dict[str, float] = {}
    for label, options in judges.items():
        shared = run.step_environments[0].reward.context
        context = RewardContext(shared.cache_path, shared.device)
        try:
            scores = make_judge(options).score(completions, prompts, answers, context)
        except ValueError as exc:  # on_error: fail
            raise GspoError(f"reward.heldout_judge ({label}): {exc}") from None
        scored = [s for s in scores if s is not None]
        if scored:
            metrics[f"{label}/mean"] = sum(scored) / len(scored)
        counts = context.drain()
        metrics[f"{label}/parse_failures"] = counts.get(PARSE_FAILURES, 0.0)
        metrics[f"{label}/errors"] = counts.get(ERRORS, 0.0)
    return metrics
