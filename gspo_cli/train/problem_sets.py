"""A run's training problems and held-out problems, from its recipe: the held-out rows are
carved out of training where they would otherwise be trained on."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from gspo_cli.data import load_rows, render_prompt
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.data.sources import carve_heldout, has_splits
from gspo_cli.errors import GspoError
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout import SamplingParams
from gspo_cli.train.heldout import rows_as_problems


@dataclass
class Problems:
    rows: list[dict[str, Any]]
    prompts: list[list[int]]  # token ids after the chat template


def load_problems(recipe: Recipe, tokenizer: PreTrainedTokenizerBase, split: str) -> Problems:
    """The training rows (`split` "train") or the held-out rows (any other), as token ids."""
    data = recipe.data
    rows = heldout_rows(recipe) if split != "train" else training_rows(recipe)
    if not rows:
        raise GspoError(f"data: the {split} split is empty")
    prompts = [render_prompt(tokenizer, str(r["prompt"]), data.prompt_template) for r in rows]
    keep = [i for i, p in enumerate(prompts) if len(p) <= data.max_prompt_tokens]
    if not keep:
        raise GspoError(
            f"data: no {split} prompt fits data.max_prompt_tokens={data.max_prompt_tokens}"
        )
    return Problems([rows[i] for i in keep], [prompts[i] for i in keep])


def carves_heldout(recipe: Recipe) -> bool:
    """True when the held-out rows would otherwise be training rows (the same source without
    splits, or the same split), so they are carved out of training instead."""
    data = recipe.data
    if recipe.eval.benchmark or (data.eval_source or data.source) != data.source:
        return False
    return not has_splits(data.source) or data.eval_split == data.split


def _carved(recipe: Recipe) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    data = recipe.data
    count = data.heldout_size or recipe.eval.num_problems
    rows = load_rows(data.source, data.split, data)
    return carve_heldout(rows, count, data.seed, data.source)


def training_rows(recipe: Recipe) -> list[dict[str, Any]]:
    data = recipe.data
    if carves_heldout(recipe):
        return _carved(recipe)[0]
    return load_rows(data.source, data.split, data)


def heldout_rows(recipe: Recipe) -> list[dict[str, Any]]:
    data = recipe.data
    if carves_heldout(recipe):
        return _carved(recipe)[1]
    return load_rows(data.eval_source or data.source, data.eval_split, data)


def heldout_note(recipe: Recipe, train_set: Problems) -> str | None:
    """The line that says held-out rows were carved out of training, and how many."""
    if not carves_heldout(recipe):
        return None
    data = recipe.data
    count = data.heldout_size or recipe.eval.num_problems
    return (
        f"held-out: {count} prompts of {data.source} set aside (data.seed {data.seed}) and not "
        f"trained on; {len(train_set.rows)} training rows"
    )


def heldout_problems(recipe: Recipe, tokenizer: PreTrainedTokenizerBase) -> list[Problem]:
    """What periodic evaluation runs on: eval.benchmark when set, else the held-out rows."""
    cfg = recipe.eval
    if cfg.benchmark:
        problems = load_benchmark(
            cfg.benchmark, cfg.data, start=cfg.start, end=cfg.end, limit=cfg.num_problems
        )
        return [replace(p, question=build_prompt(p)) for p in problems]
    held_out = load_problems(recipe, tokenizer, "test")
    return rows_as_problems(held_out.rows[: cfg.num_problems], recipe.data.prompt_template)


def eval_params(recipe: Recipe) -> SamplingParams:
    r, e = recipe.rollout, recipe.eval
    return SamplingParams(
        temperature=r.temperature if e.temperature is None else e.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=e.max_new_tokens or r.max_new_tokens,
        num_samples=e.samples,
    )
