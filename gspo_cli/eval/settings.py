"""`gspo eval`'s settings from its flags and a recipe (--recipe, or the defaults and --set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gspo_cli.core.errors import GspoError
from gspo_cli.eval.runner import EvalSettings
from gspo_cli.recipe import Recipe, RecipeError
from gspo_cli.recipe.inputs import check_template
from gspo_cli.recipe.loader import describe_error
from gspo_cli.recipe.schema import EvalConfig


def eval_settings(
    checkpoint: str,
    flags: dict[str, Any],
    engine: str | None,
    template_flag: str | None,
    recipe_file: Path | None,
    resolved: Recipe,
) -> EvalSettings:
    """`gspo eval`'s settings: each flag given, else the recipe's eval section (--recipe, or the
    defaults and --set); checked as a recipe's eval section is."""
    cfg, verifier = resolved.eval, resolved.reward  # eval defaults; maths verifier pool size
    merged = {**cfg.model_dump(), **{k: v for k, v in flags.items() if v is not None}}
    if merged["benchmark"] is None:
        raise GspoError("eval: name a benchmark with --benchmark (or eval.benchmark in --recipe)")
    settings = EvalSettings(
        checkpoint=checkpoint,
        benchmark=merged["benchmark"],
        samples=merged["samples"],
        temperature=0.6 if merged["temperature"] is None else merged["temperature"],
        top_p=merged["top_p"],
        max_new_tokens=merged["max_new_tokens"] or 1024,
        limit=merged["limit"],
        data=merged["data"],
        start=merged["start"],
        end=merged["end"],
        standings=merged["standings"],
        seed=merged["seed"],
        verifier_workers=verifier.num_workers,
        verifier_timeout_s=verifier.timeout_s,
        engine=engine or resolved.rollout.engine,
        prompt_template=eval_template(template_flag, recipe_file, resolved, merged["benchmark"]),
        # the model's own task gets the recipe's system prompt too, as its template
        system_prompt=resolved.data.system_prompt if own_task(recipe_file, merged) else None,
        chat_template=resolved.data.chat_template,
        chat_template_kwargs=resolved.data.chat_template_kwargs,
        tools=resolved.tool_settings(),  # --recipe's tools: the model answers as it trained
    )
    try:  # the same range and file checks as a recipe's eval section
        EvalConfig.model_validate({k: merged[k] for k in EvalConfig.model_fields})
    except ValidationError as exc:
        raise RecipeError("gspo eval", [describe_error(e) for e in exc.errors()]) from None
    return settings


def eval_template(
    flag: str | None, recipe_file: Path | None, recipe: Recipe, benchmark: str
) -> str | None:
    """The prompt template `gspo eval` applies: --prompt-template, else for `custom` data (a
    model's own task) the --recipe's, which the model was trained with; None: the benchmark's."""
    if flag is not None:
        try:
            return check_template(flag)
        except ValueError as exc:
            raise GspoError(f"--prompt-template: {exc}") from None
    if own_task(recipe_file, {"benchmark": benchmark}):
        return recipe.data.prompt_template
    return None


def own_task(recipe_file: Path | None, merged: dict[str, Any]) -> bool:
    """`custom` data evaluated with --recipe: the model's own task, asked as in training."""
    return recipe_file is not None and merged["benchmark"] == "custom"
