"""`gspo eval CHECKPOINT --recipe R` without a benchmark: every environment of the recipe on its
own held-out set, exactly as training evaluates it (train/run/loop.py `_evaluate`): the same
problems, samples, budget, temperature, prompt format and tools, and the same seed, so a
checkpoint's figures here are its run's held-out figures at that step (same engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from gspo_cli.data.prompts import template_kwargs
from gspo_cli.eval.checkpoints import load_for_eval
from gspo_cli.models.loading import convert_first
from gspo_cli.models.run_checkpoints import resolve_checkpoint
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import EngineSpec
from gspo_cli.rollout.engines import base_rollout_engine, with_tools
from gspo_cli.runs.folder import RESULTS, write_text_atomic
from gspo_cli.runs.marker import EVAL, owned_folder
from gspo_cli.train.run.environments import any_tools, load_environments, mixed_heldout
from gspo_cli.train.run.heldout import heldout_accuracy
from gspo_cli.train.run.problem_sets import eval_format, eval_params, tool_prompts

HELDOUT_SEED_OFFSET = 7  # training evaluates with trainer.seed + 7 (train/run/loop.py)
INTERVALS = ("accuracy", "answered", "accuracy_any_form", "ran_clean")


def evaluate_environments(
    checkpoint: str, recipe: Recipe, engine: str | None, out: Path, console: Console
) -> dict[str, Any]:
    """Each environment's held-out accuracy (and, with several, their weighted mean) in
    `out/results.json`, as `gspo compare` reads it."""
    model_path = resolve_checkpoint(checkpoint)
    convert_first(model_path, what="checkpoint")
    with owned_folder(out, "gspo eval", EVAL):
        model, tokenizer = load_for_eval(model_path)
        model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
        spec = EngineSpec(
            model,
            tokenizer,
            model.state_dict().items,
            seed=recipe.trainer.seed,
            tools=any_tools(recipe),
            model_name=model_path,
            chat_template_kwargs=template_kwargs(recipe.data),
        )
        base = base_rollout_engine(engine or recipe.rollout.engine, spec)
        environments = load_environments(recipe, tokenizer)
        values: dict[str, dict[str, float]] = {}
        try:
            with MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s) as pool:
                for env in environments.environments:
                    tools = env.recipe.tool_settings()
                    console.print(
                        f"held-out: {env.name}, {len(env.heldout)} problems", highlight=False
                    )
                    values[env.name] = heldout_accuracy(
                        base if tools is None else with_tools(base, spec, tools),
                        tokenizer,
                        env.heldout,
                        eval_params(env.recipe),
                        recipe.trainer.seed + HELDOUT_SEED_OFFSET,
                        pool,
                        eval_format(env.recipe),
                        tool_prompts(env.recipe),
                    )
        finally:
            base.close()
        several = environments.several
        flat = mixed_heldout(environments.environments, values) if several else values.popitem()[1]
        results = {"benchmark": "heldout", "checkpoint": model_path, "metrics": _entries(flat)}
        write_text_atomic(out / RESULTS, json.dumps(results, indent=2))
    for name, entry in results["metrics"].items():
        console.print(
            f"{name}: {entry['value']:.1%} [{entry['ci_low']:.1%}, {entry['ci_high']:.1%}]",
            highlight=False,
        )
    console.print(f"results: {out / RESULTS}", highlight=False)
    return results


def _entries(values: dict[str, float]) -> dict[str, dict[str, float]]:
    """{metric: {value, ci_low, ci_high}} for each accuracy-like metric with its interval."""
    out = {}
    for key, value in values.items():
        if not key.endswith(INTERVALS) or f"{key}_ci_low" not in values:
            continue
        out[key] = {
            "value": value, "ci_low": values[f"{key}_ci_low"], "ci_high": values[f"{key}_ci_high"]
        }  # fmt: skip
    return out
