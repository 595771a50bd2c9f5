"""The policy a run starts from: the recipe's model, fine-tuned once on worked solutions when
the cold start is enabled (saved in the run folder; later runs and resumes load it)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.models.loading import quiet_deepspeed_on_cpu
from gspo_cli.recipe.bounds import length_problems, shape_from_config
from gspo_cli.recipe.schema import Recipe
from gspo_cli.runs.folder import COLD_START, HF_CONFIG, save_hf_folder
from gspo_cli.train.run.console import PhaseProgress
from gspo_cli.train.run.problem_sets import Problems
from gspo_cli.train.run.sft import cold_start


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
    imitated = "worked solutions" if cfg.target == "solution" else "boxed reference answers"
    display.print(f"cold start: {cfg.steps} SFT steps on {imitated}")
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
    quiet_deepspeed_on_cpu(model.device)  # `gspo sft` on CPU: prepare_run never ran
    save_hf_folder(model, tokenizer, run_dir, COLD_START, "the cold start")
    display.print(
        f"cold start done in {time.perf_counter() - t0:.0f}s, final loss {losses[-1]:.3f}"
    )
    return model
