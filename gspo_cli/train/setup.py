"""Set-up pieces of a training run: devices, data, the run folder and the cold start."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.data import load_rows, render_prompt
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout import SamplingParams
from gspo_cli.run_folder import COLD_START, HF_CONFIG, RECIPE, staging, write_text_atomic
from gspo_cli.train.console import PhaseProgress
from gspo_cli.train.heldout import rows_as_problems
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
    """The recipe's starting policy and tokenizer (seeded, for built-in models)."""
    return load_policy(
        recipe.model.path,
        dtype=recipe.model.dtype,
        seed=recipe.trainer.seed,
        trust_remote_code=recipe.model.trust_remote_code,
    )


def load_problems(recipe: Recipe, tokenizer: PreTrainedTokenizerBase, split: str) -> Problems:
    data = recipe.data
    if split == "train":
        rows = load_rows(data.source, data.split, data)
    else:
        rows = load_rows(data.eval_source or data.source, data.eval_split, data)
    if not rows:
        raise GspoError(f"data: the {split} split is empty")
    prompts = [render_prompt(tokenizer, str(r["prompt"]), data.prompt_template) for r in rows]
    keep = [i for i, p in enumerate(prompts) if len(p) <= data.max_prompt_tokens]
    if not keep:
        raise GspoError(
            f"data: no {split} prompt fits data.max_prompt_tokens={data.max_prompt_tokens}"
        )
    return Problems([rows[i] for i in keep], [prompts[i] for i in keep])


def heldout_problems(recipe: Recipe, tokenizer: PreTrainedTokenizerBase) -> list[Problem]:
    """What periodic evaluation runs on: eval.benchmark when set, else the held-out split."""
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


# What may change when a run is resumed: how long it runs and how it reports.
RESUMABLE_CHANGES = {"trainer.steps", "logging.console", "logging.wandb", "eval.every"}


def _changed_keys(old: Any, new: Any, prefix: str = "") -> set[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = set(old) | set(new)
        return {c for k in keys for c in _changed_keys(old.get(k), new.get(k), f"{prefix}{k}.")}
    return set() if old == new else {prefix.rstrip(".")}


def prepare_run_dir(recipe: Recipe, out: Path | None, resume: bool, recipe_yaml: str) -> Path:
    """Create (or, with resume, check) the run folder and save the resolved recipe in it."""
    run_dir = out or Path(recipe.trainer.out_dir) / recipe.name
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise GspoError(
            f"run folder {run_dir} already exists: pass --resume to continue it, or --out"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / RECIPE
    if resume and saved.is_file():
        changed = _changed_keys(
            yaml.safe_load(saved.read_text(encoding="utf-8")), yaml.safe_load(recipe_yaml)
        )
        if changed - RESUMABLE_CHANGES:
            raise GspoError(f"--resume: {', '.join(sorted(changed))} differ from {saved}")
    write_text_atomic(saved, recipe_yaml)
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
    tmp = run_dir / staging(COLD_START)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    display.print(
        f"cold start done in {time.perf_counter() - t0:.0f}s, final loss {losses[-1]:.3f}"
    )
    return model
