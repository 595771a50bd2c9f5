"""`gspo train`: cold start (optional), then GSPO/GRPO steps, with evals and checkpoints.

Where this departs from the paper: the built-in task is tiny integer arithmetic, the models are
tiny, and held-out accuracy is avg@k at the rollout temperature on that task. With several
processes (DeepSpeed), each rank samples whole groups for its share of the prompts, with one
seed per prompt, so the run does not depend on the world size.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from transformers import PreTrainedModel

from gspo_cli.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout import HFGenerateEngine, SamplingParams
from gspo_cli.run_folder import CHECKPOINTS, COLD_START, SAMPLES, SUMMARY, write_text_atomic
from gspo_cli.train.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from gspo_cli.train.console import TrainingDisplay
from gspo_cli.train.distributed import (
    DistContext,
    check_world_size,
    context_from_env,
    init_process_group,
)
from gspo_cli.train.engine import FrozenPolicy, TorchEngine, TrainEngine
from gspo_cli.train.heldout import heldout_accuracy
from gspo_cli.train.rewards import RewardModel
from gspo_cli.train.run_log import RunLog, start_wandb
from gspo_cli.train.sampler import PromptSampler
from gspo_cli.train.setup import (
    Problems,
    eval_params,
    heldout_problems,
    load_problems,
    load_recipe_model,
    peak_memory_mb,
    prepare_run_dir,
    resolve_device,
    run_cold_start,
)
from gspo_cli.train.step import StepSettings, rl_step


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    heldout: dict[int, float] = field(default_factory=dict)  # step -> accuracy


def train(
    recipe: Recipe,
    recipe_yaml: str,
    *,
    out: Path | None = None,
    resume: bool = False,
    console: Console | None = None,
) -> TrainResult:
    ctx = context_from_env()
    device = resolve_device(recipe.trainer.device, ctx.local_rank)
    _check_world(recipe, ctx)
    if recipe.trainer.engine == "deepspeed":
        init_process_group(ctx, device)
    console = (console or Console()) if ctx.is_main else Console(quiet=True)
    run_dir = _run_dir(recipe, out, resume, recipe_yaml, ctx)
    torch.manual_seed(recipe.trainer.seed)
    model, tokenizer = load_recipe_model(recipe)
    train_set = load_problems(recipe, tokenizer, "train")
    eval_problems = heldout_problems(recipe, tokenizer)
    model.to(device)
    if recipe.cold_start.enabled:
        if ctx.is_main:  # one rank fine-tunes; the others load its result
            run_cold_start(recipe, model, tokenizer, train_set, run_dir, console)
        ctx.barrier()
        model, _ = load_policy(str(run_dir / COLD_START), dtype=recipe.model.dtype)
        model.to(device)
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    ref_engine = _reference(recipe, model)
    engine = _make_engine(recipe, model, ctx)
    synced = recipe.trainer.engine == "deepspeed" and recipe.deepspeed.zero_stage == 3
    rollout_engine = HFGenerateEngine(engine.model, tokenizer, synced_gpus=synced and ctx.world > 1)
    reward = RewardModel(recipe.reward)
    sampler = PromptSampler(len(train_set.rows), recipe.data.seed + recipe.trainer.seed)
    log = RunLog(run_dir, _wandb(recipe, run_dir) if ctx.is_main else None, enabled=ctx.is_main)
    start = _resume(run_dir, engine, sampler, log, ctx) if resume else 0
    if not resume:
        torch.manual_seed(recipe.trainer.seed)

    def evaluate(step: int) -> float:
        # Every rank evaluates the same problems with the same seed (ZeRO-3 needs them all
        # in each forward); rank 0 records the result.
        values = heldout_accuracy(
            rollout_engine, tokenizer, eval_problems, eval_params(recipe), recipe.trainer.seed + 7
        )
        log.evaluation(step, values)
        return values["accuracy"]

    result = TrainResult(run_dir, start, log.evaluations())
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
    q_local = recipe.rollout.num_prompts // ctx.world
    per_prompt_seeds = recipe.rollout.seed_per_prompt or ctx.world > 1
    with TrainingDisplay(console, recipe.trainer.steps, start, recipe.logging.console) as display:
        for step in range(start + 1, recipe.trainer.steps + 1):
            step_seed = recipe.trainer.seed * 1_000_003 + step
            index = sampler.next(recipe.rollout.num_prompts)  # the same on every rank
            mine = range(ctx.rank * q_local, (ctx.rank + 1) * q_local)
            output = rl_step(
                engine,
                rollout_engine,
                reward,
                [train_set.prompts[index[i]] for i in mine],
                [train_set.rows[index[i]] for i in mine],
                settings,
                step_seed,
                ref_engine,
                seeds=[step_seed * 7919 + i for i in mine] if per_prompt_seeds else None,
                ctx=ctx,
                group_offset=mine.start,
            )
            metrics = {**output.metrics, "peak_memory_mb": peak_memory_mb(device)}
            if step % recipe.eval.every == 0 or step == recipe.trainer.steps:
                result.heldout[step] = metrics["heldout_accuracy"] = evaluate(step)
            log.metrics(step, metrics)
            g = recipe.rollout.group_size
            _log_samples(
                log, step, output, recipe.trainer.log_samples, g, index[mine.start :], train_set
            )
            display.step(step, metrics)
            if step % recipe.trainer.checkpoint_every == 0 or step == recipe.trainer.steps:
                state = {"sampler": sampler.state_dict(), "world": ctx.world}
                save_checkpoint(
                    run_dir / CHECKPOINTS,
                    step,
                    engine,
                    tokenizer,
                    state,
                    recipe.trainer.keep_checkpoints,
                    ctx,
                )
            result.steps_done = step
    if ctx.is_main:
        _finish(console, run_dir, result)
    log.close()
    return result


def _check_world(recipe: Recipe, ctx: DistContext) -> None:
    if ctx.world > 1 and recipe.trainer.engine != "deepspeed":
        raise GspoError("several processes need trainer.engine: deepspeed")
    check_world_size(recipe, ctx.world)


def _run_dir(
    recipe: Recipe, out: Path | None, resume: bool, recipe_yaml: str, ctx: DistContext
) -> Path:
    run_dir = out or Path(recipe.trainer.out_dir) / recipe.name
    if ctx.is_main:
        prepare_run_dir(recipe, run_dir, resume, recipe_yaml)
    ctx.barrier()
    return run_dir


def _make_engine(recipe: Recipe, model: PreTrainedModel, ctx: DistContext) -> TrainEngine:
    if recipe.trainer.engine == "deepspeed":
        from gspo_cli.train.ds_engine import DeepSpeedEngine

        return DeepSpeedEngine(model, recipe, ctx)
    return TorchEngine(model, recipe.optimizer, _optimizer_steps(recipe))


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


def _resume(
    run_dir: Path, engine: TrainEngine, sampler: PromptSampler, log: RunLog, ctx: DistContext
) -> int:
    root = run_dir / CHECKPOINTS
    if ctx.is_main:
        latest_checkpoint(root)  # removes what a kill during a save left behind
    ctx.barrier()
    folder = latest_checkpoint(root, cleanup=False)
    if folder is None:  # killed before the first checkpoint: start over, keep the cold start
        log.truncate_after(-1)
        return 0
    state = load_trainer_state(folder)
    saved_world = int(state.get("world", 1))
    if saved_world != ctx.world and not engine_allows_resharding(engine):
        raise GspoError(
            f"checkpoint {folder} was written by {saved_world} process(es); this engine cannot "
            f"re-partition its optimizer state for {ctx.world}: resume with --nproc {saved_world}"
        )
    engine.load_state(folder)
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    log.truncate_after(int(state["step"]))
    return int(state["step"])


def engine_allows_resharding(engine: TrainEngine) -> bool:
    """Plain torch and ZeRO-0 keep whole optimizer states; ZeRO 1-3 partition them per rank."""
    return getattr(engine, "zero_stage", 0) == 0


def _log_samples(
    log: RunLog, step: int, output: Any, count: int, g: int, index: list[int], problems: Problems
) -> None:
    for i in range(min(count, len(output.rollout.texts))):
        row = problems.rows[index[i // g]]
        log.append(
            SAMPLES,
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
    model, tokenizer = load_recipe_model(recipe)
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
    console.print(f"HF checkpoint: {run_dir / COLD_START}", highlight=False)
    return run_dir / COLD_START
