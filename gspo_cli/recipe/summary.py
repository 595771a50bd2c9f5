"""A recipe in one line: what `gspo validate` prints, and `gspo train` once at its start."""

from __future__ import annotations

from gspo_cli.recipe.schema import Recipe


def summary_line(recipe: Recipe) -> str:
    """The run's name, loss and its limits, model, data, batch shape and reward limit."""
    from gspo_cli.algorithms import LOSS_SPECS  # torch: once the recipe is known to be good

    algo, rollout = recipe.algorithm, recipe.rollout
    limits = f"clip {algo.clip_low:g}/{algo.clip_high:g}"
    if not LOSS_SPECS.get(algo.name).hard_clip:
        limits = f"gate tau {algo.sapo_tau_pos:g}/{algo.sapo_tau_neg:g}"
    return (
        f"{recipe.name}: {algo.name} ({limits}, "
        f"{algo.loss_agg}), model {recipe.model.path}, {_data(recipe)}, "
        f"{recipe.trainer.steps} steps x {rollout.num_prompts} prompts x {rollout.group_size} "
        f"samples, {algo.minibatches} minibatches, {reward_limit(recipe)}"
        + ("" if algo.distill is None else f", distilling from {algo.distill.teacher}")
    )


def reward_limit(recipe: Recipe) -> str:
    """reward.timeout_s is per completion: what that makes for a step, said once at start."""
    per, n = recipe.reward.timeout_s, recipe.rollout.num_prompts * recipe.rollout.group_size
    return f"reward limit {per:g} s per completion ({per * n:g} s for a step's {n})"


def _data(recipe: Recipe) -> str:
    """The data source, or the environments with their weights."""
    if not recipe.environments:
        return f"data {recipe.data.source}"
    views = recipe.environments_resolved()
    return "environments " + ", ".join(
        f"{v.name} ({v.recipe.data.source}, weight {v.weight:g})" for v in views
    )
