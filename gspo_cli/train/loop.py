"""`gspo train`: cold start (optional), then GSPO/GRPO steps, with evals and checkpoints.

Where this departs from the paper: the built-in task is tiny integer arithmetic, the models are
tiny, and held-out accuracy is avg@k at the rollout temperature on that task.
"""

from __future__ import annotations

import copy
import json
import resource
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.data import load_rows, render_prompt
from gspo_cli.errors import GspoError
from gspo_cli.eval.benchmarks import build_prompt, load_benchmark
from gspo_cli.eval.problems import Problem
from gspo_cli.models import load_policy
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout import HFGenerateEngine, SamplingParams
from gspo_cli.train.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    restore_weights,
    save_checkpoint,
    set_rng_state,
    write_text_atomic,
)
from gspo_cli.train.console import TrainingDisplay
from gspo_cli.train.engine import TRAIN_ENGINES, FrozenPolicy, TrainEngine
from gspo_cli.train.heldout import heldout_accuracy, rows_as_problems
from gspo_cli.train.rewards import RewardModel
from gspo_cli.train.run_log import RunLog, start_wandb
from gspo_cli.train.sampler import PromptSampler
from gspo_cli.train.sft import cold_start
from gspo_cli.train.step import StepSettings, rl_step

RECIPE_FILE, COLD_START_DIR, CHECKPOINTS_DIR, SUMMARY = (
    "recipe.yaml",
    "cold_start",
    "checkpoints",
    "summary.json",
)


@dataclass
class Problems:
    rows: list[dict[str, Any]]
    prompts: list[list[int]]  # token ids after the chat template


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    heldout: dict[int, float] = field(default_factory=dict)  # step -> accuracy


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise GspoError("trainer.device: cuda requested but no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


def prepare_run_dir(recipe: Recipe, out: Path | None, resume: bool, recipe_yaml: str) -> Path:
    run_dir = out or Path(recipe.trainer.out_dir) / recipe.name
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise GspoError(
            f"run folder {run_dir} already exists: pass --resume to continue it, or --out"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / RECIPE_FILE
    if resume and saved.is_file() and saved.read_text(encoding="utf-8") != recipe_yaml:
        raise GspoError(f"--resume: the recipe differs from the one saved in {saved}")
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
    folder = run_dir / COLD_START_DIR
    if (folder / "config.json").is_file():
        model, _ = load_policy(str(folder), dtype=recipe.model.dtype)
        return model
    cfg = recipe.cold_start
    display.print(f"cold start: {cfg.steps} SFT steps on worked solutions")
    t0 = time.perf_counter()
    losses = cold_start(model, tokenizer, train.prompts, train.rows, cfg, recipe.trainer.seed)
    tmp = run_dir / f".{COLD_START_DIR}.tmp"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    display.print(
        f"cold start done in {time.perf_counter() - t0:.0f}s, final loss {losses[-1]:.3f}"
    )
    return model


def train(
    recipe: Recipe,
    recipe_yaml: str,
    *,
    out: Path | None = None,
    resume: bool = False,
    console: Console | None = None,
) -> TrainResult:
    console = console or Console()
    run_dir = prepare_run_dir(recipe, out, resume, recipe_yaml)
    device = resolve_device(recipe.trainer.device)
    torch.manual_seed(recipe.trainer.seed)
    model, tokenizer = load_policy(
        recipe.model.path,
        dtype=recipe.model.dtype,
        seed=recipe.trainer.seed,
        trust_remote_code=recipe.model.trust_remote_code,
    )
    train_set = load_problems(recipe, tokenizer, "train")
    eval_problems = heldout_problems(recipe, tokenizer)
    model.to(device)
    if recipe.cold_start.enabled:
        model = run_cold_start(recipe, model, tokenizer, train_set, run_dir, console).to(device)
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    ref_engine = _reference(recipe, model)
    engine: TrainEngine = TRAIN_ENGINES.get(recipe.trainer.engine)(
        model, recipe.optimizer, _optimizer_steps(recipe)
    )
    rollout_engine = HFGenerateEngine(model, tokenizer)
    reward = RewardModel(recipe.reward)
    sampler = PromptSampler(len(train_set.rows), recipe.data.seed + recipe.trainer.seed)
    log = RunLog(run_dir, _wandb(recipe, run_dir))
    start = _resume(run_dir, engine, sampler, log) if resume else 0
    if not resume:
        torch.manual_seed(recipe.trainer.seed)

    def evaluate(step: int) -> float:
        values = heldout_accuracy(
            rollout_engine, tokenizer, eval_problems, eval_params(recipe), recipe.trainer.seed + 7
        )
        log.evaluation(step, values)
        return values["accuracy"]

    result = TrainResult(run_dir, start)
    if start == 0:
        result.heldout[0] = evaluate(0)
        console.print(f"held-out accuracy before RL: {result.heldout[0]:.1%}", highlight=False)
    settings = StepSettings(
        recipe.algorithm,
        _rollout_params(recipe),
        recipe.trainer.micro_batch_size,
        recipe.rollout.use_engine_logprobs,
        int(tokenizer.pad_token_id),
    )
    generator = torch.Generator()
    with TrainingDisplay(console, recipe.trainer.steps, start, recipe.logging.console) as display:
        for step in range(start + 1, recipe.trainer.steps + 1):
            generator.manual_seed(recipe.trainer.seed * 1_000_003 + step)
            index = sampler.next(recipe.rollout.num_prompts)
            output = rl_step(
                engine,
                rollout_engine,
                reward,
                [train_set.prompts[i] for i in index],
                [train_set.rows[i] for i in index],
                settings,
                generator,
                ref_engine,
            )
            metrics = {**output.metrics, "peak_memory_mb": peak_memory_mb(device)}
            if step % recipe.eval.every == 0 or step == recipe.trainer.steps:
                result.heldout[step] = metrics["heldout_accuracy"] = evaluate(step)
            log.metrics(step, metrics)
            _log_samples(
                log,
                step,
                output,
                recipe.trainer.log_samples,
                recipe.rollout.group_size,
                index,
                train_set,
            )
            display.step(step, metrics)
            if step % recipe.trainer.checkpoint_every == 0 or step == recipe.trainer.steps:
                save_checkpoint(
                    run_dir / CHECKPOINTS_DIR,
                    step,
                    engine,
                    tokenizer,
                    {"sampler": sampler.state_dict()},
                    recipe.trainer.keep_checkpoints,
                )
            result.steps_done = step
    _finish(console, run_dir, result)
    if log.wandb_run is not None:
        log.wandb_run.finish()
    return result


def _optimizer_steps(recipe: Recipe) -> int:
    return recipe.trainer.steps * recipe.algorithm.minibatches


def _rollout_params(recipe: Recipe) -> SamplingParams:
    r = recipe.rollout
    return SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens, r.group_size)


def _reference(recipe: Recipe, model: PreTrainedModel) -> FrozenPolicy | None:
    """A frozen copy of the starting policy, only when the KL penalty is on."""
    if recipe.algorithm.kl_coef == 0:
        return None
    return FrozenPolicy(copy.deepcopy(model).eval().requires_grad_(False))


def _wandb(recipe: Recipe, run_dir: Path) -> Any:
    if not recipe.logging.wandb:
        return None
    cfg = recipe.logging
    return start_wandb(
        run_dir, cfg.wandb_project, cfg.wandb_mode, recipe.name, recipe.model_dump(mode="json")
    )


def _resume(run_dir: Path, engine: TrainEngine, sampler: PromptSampler, log: RunLog) -> int:
    folder = latest_checkpoint(run_dir / CHECKPOINTS_DIR)
    if folder is None:  # killed before the first checkpoint: start over, keep the cold start
        log.truncate_after(-1)
        return 0
    state = load_trainer_state(folder)
    restore_weights(engine.model, folder)
    engine.load_state_dict(state["engine"])
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    log.truncate_after(int(state["step"]))
    return int(state["step"])


def _log_samples(
    log: RunLog, step: int, output: Any, count: int, g: int, index: list[int], problems: Problems
) -> None:
    for i in range(min(count, len(output.rollout.texts))):
        row = problems.rows[index[i // g]]
        log.append(
            "samples.jsonl",
            {
                "step": step,
                "prompt": str(row["prompt"]),
                "answer": str(row.get("answer")),
                "completion": output.rollout.texts[i],
                "reward": output.rewards[i],
            },
        )


def _finish(console: Console, run_dir: Path, result: TrainResult) -> None:
    summary = {
        "steps": result.steps_done,
        "heldout_accuracy": {str(k): v for k, v in result.heldout.items()},
    }
    write_text_atomic(run_dir / SUMMARY, json.dumps(summary, indent=2))
    if 0 in result.heldout and len(result.heldout) > 1:
        last = max(result.heldout)
        before, after = result.heldout[0], result.heldout[last]
        console.print(
            f"held-out accuracy: before RL {before:.1%} -> after {last} steps {after:.1%} "
            f"({(after - before) * 100:+.1f} points)",
            highlight=False,
        )
    console.print(f"run folder: {run_dir}", highlight=False)


def run_sft_only(
    recipe: Recipe, recipe_yaml: str, *, out: Path | None = None, console: Console | None = None
) -> Path:
    """`gspo sft`: the cold start alone, saved as an HF checkpoint, with held-out accuracy."""
    console = console or Console()
    run_dir = prepare_run_dir(recipe, out, False, recipe_yaml)
    device = resolve_device(recipe.trainer.device)
    model, tokenizer = load_policy(
        recipe.model.path,
        dtype=recipe.model.dtype,
        seed=recipe.trainer.seed,
        trust_remote_code=recipe.model.trust_remote_code,
    )
    train_set = load_problems(recipe, tokenizer, "train")
    eval_problems = heldout_problems(recipe, tokenizer)
    model = run_cold_start(recipe, model.to(device), tokenizer, train_set, run_dir, console).to(
        device
    )
    values = heldout_accuracy(
        HFGenerateEngine(model, tokenizer),
        tokenizer,
        eval_problems,
        eval_params(recipe),
        recipe.trainer.seed + 7,
    )
    RunLog(run_dir).evaluation(0, values)
    console.print(f"held-out accuracy after cold start: {values['accuracy']:.1%}", highlight=False)
    console.print(f"HF checkpoint: {run_dir / COLD_START_DIR}", highlight=False)
    return run_dir / COLD_START_DIR
