"""Set-up pieces of a training run: devices, data, the run folder and the cold start."""

from __future__ import annotations

import resource
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.data import load_rows, render_prompt
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.data.sources import carve_heldout, has_splits
from gspo_cli.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.recipe.bounds import length_problems, shape_from_config
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout import SamplingParams
from gspo_cli.run_folder import (
    COLD_START,
    HF_CONFIG,
    RECIPE,
    check_run_folder,
    remove_partial,
    run_dir_of,
    staging,
    write_error,
    write_text_atomic,
)
from gspo_cli.train.console import PhaseProgress
from gspo_cli.train.heldout import rows_as_problems
from gspo_cli.train.resume import check_resumable
from gspo_cli.train.sft import cold_start


@dataclass
class Problems:
    rows: list[dict[str, Any]]
    prompts: list[list[int]]  # token ids after the chat template


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise GspoError("trainer.device: cuda requested but no CUDA device is available")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def load_recipe_model(recipe: Recipe) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The recipe's starting policy and tokenizer (seeded, for built-in models). Lengths are
    checked against its positions again: validation cannot see a hub model's config."""
    model, tokenizer = load_policy(
        recipe.model.path,
        dtype=recipe.model.dtype,
        seed=recipe.trainer.seed,
        trust_remote_code=recipe.model.trust_remote_code,
    )
    problems = length_problems(recipe, shape_from_config(model.config.to_dict()))
    if problems:
        raise GspoError(problems[0])
    return model, tokenizer


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


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def prepare_run_dir(recipe: Recipe, out: Path | None, resume: bool, recipe_yaml: str) -> Path:
    """Create (or, with resume, check) the run folder and save the resolved recipe in it.

    A folder a failed start left (no checkpoint, cold start, metrics) never blocks a rerun."""
    run_dir = run_dir_of(recipe, out)
    check_run_folder(run_dir, resume)
    saved = run_dir / RECIPE
    if resume and saved.is_file():
        check_resumable(run_dir, recipe_yaml)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(saved, recipe_yaml)
    except OSError as exc:
        raise write_error(exc, run_dir) from None
    return run_dir


def run_cold_start(
    recipe: Recipe,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Problems,
    run_dir: Path,
    display: Console,
) -> PreTrainedModel:
    """Fine-tune on worked solutions once; later runs and resumes load the saved result."""
    folder = run_dir / COLD_START
    if (folder / HF_CONFIG).is_file():
        model, _ = load_policy(str(folder), dtype=recipe.model.dtype)
        return model
    cfg = recipe.cold_start
    display.print(f"cold start: {cfg.steps} SFT steps on worked solutions")
    t0 = time.perf_counter()
    plain = recipe.logging.console == "plain"
    with PhaseProgress(display, "cold start", cfg.steps, plain) as progress:
        losses = cold_start(
            model,
            tokenizer,
            train.prompts,
            train.rows,
            cfg,
            recipe.trainer.seed,
            on_step=lambda step, loss: progress.update(step, f"loss {loss:.3f}"),
        )
    _save_cold_start(model, tokenizer, run_dir)
    display.print(
        f"cold start done in {time.perf_counter() - t0:.0f}s, final loss {losses[-1]:.3f}"
    )
    return model


def _save_cold_start(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, run_dir: Path
) -> None:
    """Written under a staging name and renamed: a kill or a full disk leaves no half folder."""
    tmp = run_dir / staging(COLD_START)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(run_dir / COLD_START)
    except BaseException as exc:
        problem = remove_partial(tmp, exc, run_dir)
        if problem is None:
            raise
        raise GspoError(f"{problem}: the cold start was not saved") from None
