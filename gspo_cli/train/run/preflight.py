"""What a recipe asks of its models, checked before anything is written (`gspo validate`,
`gspo train`): LoRA targets and rank, the distillation teacher, the chat template's tool turns.
Each check loads torch or a tokenizer, so it is imported only where needed."""

from __future__ import annotations

from pathlib import Path

from gspo_cli.recipe import Recipe, RecipeError


def check_model_fit(file: Path, recipe: Recipe, *, hub: bool) -> None:
    """A LoRA target the model lacks or ties, a rank too large for its layers or the machine's
    memory, a teacher missing or with other token ids, a chat template without tool turns:
    one line (RecipeError, exit 2), before anything is written."""
    problems = []  # imported only where needed: both load torch; `hub`: train, not validate
    if recipe.model.lora.r:
        from gspo_cli.train.engines.adapters import early_lora_problem

        problems.append(early_lora_problem(recipe))
    if recipe.algorithm.distill is not None:
        from gspo_cli.train.run.teacher import missing_teacher, teacher_problem

        missing = missing_teacher(recipe, file)
        problems.append(missing if missing is not None else teacher_problem(recipe, hub=hub))
    problems += _tool_template_problems(recipe, hub=hub)
    for problem in problems:
        if problem is not None:
            raise RecipeError(str(file), [problem])


def _tool_template_problems(recipe: Recipe, *, hub: bool) -> list[str | None]:
    """`format: chat_template` on a model whose template cannot render tool turns, for each
    environment that uses it."""
    views = [v.recipe for v in recipe.environments_resolved() if v.recipe.rollout.tools]
    if not any(v.rollout.tools and v.rollout.tools.format == "chat_template" for v in views):
        return []
    from gspo_cli.data.prompts import template_kwargs
    from gspo_cli.models.vocab import load_tokenizer
    from gspo_cli.rollout.tools.build import tool_template_problem

    tokenizer = load_tokenizer(recipe.model.path, what="model.path", hub=hub)
    return [
        tool_template_problem(v.tool_settings(), tokenizer, v.model.path, template_kwargs(v.data))
        for v in views
    ]
