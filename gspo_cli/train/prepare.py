"""Everything a training run needs before its first step, built once: `prepare_run`.

The loop (`train/loop.py`) only reads a `PreparedRun`; what is opened here (the maths verifier
pool, the run log) is closed by `PreparedRun.close`.
"""

from __future__ import annotations

import copy
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.data.problems import Problem
from gspo_cli.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout import EngineSpec, RolloutEngine, SamplingParams, make_rollout_engine
from gspo_cli.run_folder import CHECKPOINTS, COLD_START, HF_CONFIG, LATEST, run_dir_of, step_folder
from gspo_cli.train.checkpoint import (
    checkpoint_at_or_before,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from gspo_cli.train.distributed import (
    DistContext,
    check_world_size,
    context_from_env,
    init_process_group,
)
from gspo_cli.train.engine import FrozenPolicy, TrainEngine, make_engine
from gspo_cli.train.rewards import RewardModel
from gspo_cli.train.run_log import RunLog, start_wandb
from gspo_cli.train.sampler import PromptSampler
from gspo_cli.train.setup import (
    Problems,
    heldout_note,
    heldout_problems,
    load_problems,
    load_recipe_model,
    prepare_run_dir,
    resolve_device,
    run_cold_start,
)
from gspo_cli.train.signals import Stopped, StopRequest
from gspo_cli.train.step import StepSettings


@dataclass
class PreparedRun:
    recipe: Recipe
    ctx: DistContext
    device: torch.device
    run_dir: Path
    console: Console
    tokenizer: PreTrainedTokenizerBase
    train_set: Problems
    eval_problems: list[Problem]
    engine: TrainEngine
    rollout_engine: RolloutEngine
    ref_engine: FrozenPolicy | None
    reward: RewardModel
    math_pool: MathVerifierPool
    sampler: PromptSampler
    log: RunLog
    settings: StepSettings
    start: int  # the last step already done (0 for a new run)
    stop: StopRequest  # set by SIGTERM; see stop_at_boundary

    def close(self) -> None:
        self.log.close()
        self.math_pool.close()
        self.rollout_engine.close()

    def save_checkpoint(self, step: int) -> Path:
        """Checkpoint `step`: weights, optimizer, sampler position and RNG (all ranks call it)."""
        state = {"sampler": self.sampler.state_dict(), "world": self.ctx.world}
        return save_checkpoint(
            self.run_dir / CHECKPOINTS,
            step,
            self.engine,
            self.tokenizer,
            state,
            self.recipe.trainer.keep_checkpoints,
            self.ctx,
        )

    def stop_at_boundary(self, step: int) -> None:
        """The loop's SIGTERM hook, called on every rank once step `step` is done (after its own
        checkpoint, if any): when a stop was asked on any rank, checkpoint `step` unless it just
        was, then raise Stopped. Does nothing otherwise (one all-reduce with several ranks)."""
        if not self.stop.agreed(self.ctx):
            return
        self.stop.stopping()
        latest = latest_checkpoint(self.run_dir / CHECKPOINTS, cleanup=False)
        if latest is None or latest.name != step_folder(step):
            self.save_checkpoint(step)
        raise Stopped(self.stop.signum or signal.SIGTERM)


def prepare_run(
    recipe: Recipe,
    recipe_yaml: str,
    out: Path | None,
    resume: bool,
    console: Console | None,
    stop: StopRequest | None = None,
) -> PreparedRun:
    """Processes, run folder, model (after the cold start), engines, rewards and resume state.

    `stop` is the SIGTERM request the loop polls (`stop_on_signals`); None: never set."""
    ctx = context_from_env()
    device = resolve_device(recipe.trainer.device, ctx.local_rank)
    if ctx.world > 1 and recipe.trainer.engine != "deepspeed":
        raise GspoError("several processes need trainer.engine: deepspeed")
    check_world_size(recipe, ctx.world)
    if recipe.trainer.engine == "deepspeed":
        init_process_group(ctx, device)
    console = (console or Console()) if ctx.is_main else Console(quiet=True)
    run_dir = _run_dir(recipe, out, resume, recipe_yaml, ctx)
    console.print(f"run folder: {run_dir}", highlight=False)  # first, so a user can look in
    torch.manual_seed(recipe.trainer.seed)
    model, tokenizer = load_recipe_model(recipe)
    train_set = load_problems(recipe, tokenizer, "train")
    eval_problems = heldout_problems(recipe, tokenizer)
    if (note := heldout_note(recipe, train_set)) is not None:
        console.print(note, highlight=False, soft_wrap=True)
    model = _after_cold_start(recipe, model.to(device), tokenizer, train_set, run_dir, ctx, console)
    model.to(device)
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    ref_engine = _reference(recipe, model)
    engine = make_engine(model, recipe, ctx)
    zero3 = recipe.trainer.engine == "deepspeed" and recipe.deepspeed.zero_stage == 3
    spec = EngineSpec(
        engine.model,
        tokenizer,
        engine.full_weights,
        seed=recipe.trainer.seed + ctx.rank,
        synced_gpus=zero3 and ctx.world > 1,
        options=recipe.rollout.vllm.model_dump(),
    )
    rollout_engine = make_rollout_engine(recipe.rollout.engine, spec)
    math_pool = MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s)
    reward = RewardModel(recipe.reward, RewardServices(math_pool=math_pool))
    sampler = PromptSampler(len(train_set.rows), recipe.data.seed + recipe.trainer.seed)
    log = RunLog(run_dir, _wandb(recipe, run_dir) if ctx.is_main else None, enabled=ctx.is_main)
    start = _resume(run_dir, engine, sampler, log, ctx, console) if resume else 0
    if not resume:
        torch.manual_seed(recipe.trainer.seed)
    settings = StepSettings(
        recipe.algorithm,
        rollout_params(recipe),
        recipe.trainer.micro_batch_size,
        recipe.rollout.use_engine_logprobs,
        int(tokenizer.pad_token_id),
        recipe.trainer.max_tokens_per_micro_batch,
        recipe.trainer.skip_zero_advantage,
    )
    return PreparedRun(
        recipe, ctx, device, run_dir, console, tokenizer, train_set, eval_problems, engine,
        rollout_engine, ref_engine, reward, math_pool, sampler, log, settings, start,
        stop or StopRequest(),
    )  # fmt: skip


def rollout_params(recipe: Recipe) -> SamplingParams:
    """Sampling for RL steps; engine log-probs only where something reads them (pi_old, the
    rollout correction, or the mismatch metrics of an engine with its own weights)."""
    r = recipe.rollout
    wanted = (
        r.use_engine_logprobs
        or recipe.algorithm.rollout_correction != "off"
        or (r.engine != "hf" and r.top_p == 1 and r.top_k == 0)
    )
    return SamplingParams(
        r.temperature,
        r.top_p,
        r.top_k,
        r.max_new_tokens,
        r.group_size,
        logprobs=wanted,
        routed_experts=recipe.algorithm.routing_replay == "rollout",
    )


def _run_dir(
    recipe: Recipe, out: Path | None, resume: bool, recipe_yaml: str, ctx: DistContext
) -> Path:
    run_dir = run_dir_of(recipe, out)
    if ctx.is_main:
        prepare_run_dir(recipe, run_dir, resume, recipe_yaml)
    ctx.barrier()
    return run_dir


def _after_cold_start(
    recipe: Recipe,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_set: Problems,
    run_dir: Path,
    ctx: DistContext,
    console: Console,
) -> PreTrainedModel:
    """The policy RL starts from: the cold-start result when enabled (one rank trains it)."""
    if not recipe.cold_start.enabled:
        return model
    if ctx.is_main:
        run_cold_start(recipe, model, tokenizer, train_set, run_dir, console)
    ctx.barrier()
    model, _ = load_policy(str(run_dir / COLD_START), dtype=recipe.model.dtype)
    return model


def _reference(recipe: Recipe, model: PreTrainedModel) -> FrozenPolicy | None:
    """A frozen copy of the starting policy, only when the KL penalty is on."""
    if recipe.algorithm.kl_coef == 0:
        return None
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    return FrozenPolicy(frozen, recipe.trainer.share_prompts)


def _wandb(recipe: Recipe, run_dir: Path) -> Any:
    if not recipe.logging.wandb:
        return None
    cfg = recipe.logging
    return start_wandb(
        run_dir, cfg.wandb_project, cfg.wandb_mode, recipe.name, recipe.model_dump(mode="json")
    )


def _resume(
    run_dir: Path,
    engine: TrainEngine,
    sampler: PromptSampler,
    log: RunLog,
    ctx: DistContext,
    console: Console,
) -> int:
    root = run_dir / CHECKPOINTS
    if ctx.is_main:
        latest_checkpoint(root)  # removes what a kill during a save left behind
    ctx.barrier()
    folder = latest_checkpoint(root, cleanup=False)
    if folder is None:  # killed before the first checkpoint: start over, keep the cold start
        kept = " (the cold start is kept)" if (run_dir / COLD_START / HF_CONFIG).is_file() else ""
        console.print(
            f"no checkpoint in {root}: starting from step 0{kept}", highlight=False, soft_wrap=True
        )
        log.truncate_after(-1)
        return 0
    state = load_trainer_state(folder)
    saved_world = int(state.get("world", 1))
    if saved_world != ctx.world and not engine.allows_resharding:
        raise GspoError(
            f"checkpoint {folder} was written by {saved_world} process(es); this engine cannot "
            f"re-partition its optimizer state for {ctx.world}: resume with --nproc {saved_world}"
        )
    engine.load_state(folder)
    if not engine.weights_finite():  # written before the guard existed, or by another tool
        older = checkpoint_at_or_before(root, int(state["step"]) - 1)
        hint = (
            f"the last good one is {older}: write {older.name} into {root / LATEST}"
            if older
            else "none is older: start over"
        )
        raise GspoError(f"checkpoint {folder} holds non-finite weights; {hint}")
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    log.truncate_after(int(state["step"]))
    return int(state["step"])
