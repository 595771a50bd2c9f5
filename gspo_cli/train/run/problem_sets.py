"""A run's training problems and held-out problems, from its recipe: the held-out rows are
carved out of training where they would otherwise be trained on. Rows dropped on the way (a null
answer, a prompt over data.max_prompt_tokens) are counted in one line each (`RunProblems.notes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.data import load_rows, render_prompt
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.data.formats import clean_rows
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import PromptFormat, PromptSettings
from gspo_cli.data.sources import carve_heldout, has_splits, source_note
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rewards.binding import text_answer_readers
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.tools.build import tool_schemas_for
from gspo_cli.train.run.heldout import rows_as_problems


@dataclass
class Problems:
    rows: list[dict[str, Any]]
    prompts: list[list[int]]  # token ids after the chat template
    notes: list[str] = field(default_factory=list)  # one line per kind of dropped rows


@dataclass
class RunProblems:
    train: Problems
    heldout: list[Problem]  # what periodic evaluation runs on
    notes: list[str]  # lines for the console: held-out rows set aside, rows dropped


def run_problems(recipe: Recipe, tokenizer: PreTrainedTokenizerBase) -> RunProblems:
    """The training problems, the held-out problems and the lines that say what was set aside
    or dropped (each once)."""
    train = load_problems(recipe, tokenizer, "train")
    heldout, held_notes = _heldout(recipe, tokenizer)
    carved = heldout_note(recipe, train)
    notes = [*train.notes, *held_notes, *([carved] if carved else [])]
    return RunProblems(train, heldout, list(dict.fromkeys(notes)))


def tool_prompts(recipe: Recipe) -> list[dict[str, Any]] | None:
    """The tool schemas prompts show (a chat template's tool calls), else None."""
    tools = recipe.tool_settings()
    return None if tools is None else tool_schemas_for(tools)


def load_problems(recipe: Recipe, tokenizer: PreTrainedTokenizerBase, split: str) -> Problems:
    """The training rows (`split` "train") or the held-out rows (any other), as token ids."""
    data = recipe.data
    rows, notes = _split_rows(recipe, split)
    if not rows:
        raise GspoError(f"data: the {split} split is empty")
    name = "training" if split == "train" else "held-out"
    schemas = tool_prompts(recipe)
    prompts = [
        render_prompt(
            tokenizer, r["prompt"], data, f"data: {name} row {i} ({_preview(r)})", tools=schemas
        )
        for i, r in enumerate(rows)
    ]
    keep = [i for i, p in enumerate(prompts) if len(p) <= data.max_prompt_tokens]
    if not keep:
        raise GspoError(
            f"data: no {split} prompt fits data.max_prompt_tokens={data.max_prompt_tokens}"
        )
    if len(keep) < len(rows):
        notes.append(
            f"data: {len(rows) - len(keep)} of {len(rows)} {name} prompts are longer than "
            f"data.max_prompt_tokens={data.max_prompt_tokens}: dropped"
        )
    return Problems([rows[i] for i in keep], [prompts[i] for i in keep], notes)


def _preview(row: dict[str, Any]) -> str:
    """The start of a row's question, so that an error names a row one can find."""
    prompt = row["prompt"]
    users = [] if isinstance(prompt, str) else [t["content"] for t in prompt if t["role"] == "user"]
    text = prompt if isinstance(prompt, str) else (users or [prompt[-1]["content"]])[-1]
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _clean(
    recipe: Recipe, source: str, rows: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """`rows` in the form training reads (data.formats), and the line counting null answers."""
    readers = text_answer_readers([f.name for f in recipe.reward.functions])
    rows, dropped = clean_rows(rows, source, readers)
    if not dropped:
        return rows, []
    return rows, [f"data: {dropped} rows of {source} have a null answer (and no tests): dropped"]


def carves_heldout(recipe: Recipe) -> bool:
    """True when the held-out rows would otherwise be training rows (the same source without
    splits, or the same split), so they are carved out of training instead."""
    data = recipe.data
    if recipe.eval.benchmark or (data.eval_source or data.source) != data.source:
        return False
    return not has_splits(data.source) or data.eval_split == data.split


def _split_rows(recipe: Recipe, split: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The training rows (`split` "train") or the held-out rows, cleaned, and their notes."""
    data = recipe.data
    if carves_heldout(recipe):
        count = data.heldout_size or recipe.eval.num_problems
        rows, notes = _clean(recipe, data.source, load_rows(data.source, data.split, data))
        train, held = carve_heldout(rows, count, data.seed, data.source)
        return (train if split == "train" else held), notes
    source = data.source if split == "train" else data.eval_source or data.source
    rows = load_rows(source, data.split if split == "train" else data.eval_split, data)
    rows, notes = _clean(recipe, source, rows)
    note = source_note(source, data.split if split == "train" else data.eval_split, data)
    return rows, [*notes, *([note] if note else [])]


def training_rows(recipe: Recipe) -> list[dict[str, Any]]:
    return _split_rows(recipe, "train")[0]


def heldout_rows(recipe: Recipe) -> list[dict[str, Any]]:
    return _split_rows(recipe, "test")[0]


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
    return _heldout(recipe, tokenizer)[0]


def _heldout(recipe: Recipe, tokenizer: PreTrainedTokenizerBase) -> tuple[list[Problem], list[str]]:
    cfg = recipe.eval
    if cfg.benchmark:
        problems = load_benchmark(
            cfg.benchmark, cfg.data, start=cfg.start, end=cfg.end, limit=cfg.num_problems
        )
        return [replace(p, question=build_prompt(p)) for p in problems], []
    held_out = load_problems(recipe, tokenizer, "test")
    return rows_as_problems(held_out.rows[: cfg.num_problems]), held_out.notes


def eval_format(recipe: Recipe) -> PromptSettings:
    """How held-out problems are rendered: held-out rows as training prompts are; eval.benchmark
    problems in their benchmark's words (no template, no system prompt), as `gspo eval` asks
    them, with the recipe's chat template settings."""
    data = recipe.data
    if not recipe.eval.benchmark:
        return data
    return PromptFormat(
        chat_template=data.chat_template, chat_template_kwargs=data.chat_template_kwargs
    )


def eval_params(recipe: Recipe) -> SamplingParams:
    r, e = recipe.rollout, recipe.eval
    return SamplingParams(
        temperature=r.temperature if e.temperature is None else e.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=e.max_new_tokens or r.max_new_tokens,
        num_samples=e.samples,
    )
