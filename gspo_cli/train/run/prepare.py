"""Everything a training run needs before its first step, built once: `prepare_run`.

The loop (`train/run/loop.py`) only reads a `PreparedRun`; what is opened here (the maths verifier
pool, the run log) is closed by `PreparedRun.close`.
"""

from __future__ import annotations

import copy
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES, TRAIN_ENGINES
from gspo_cli.core.errors import GspoError, Stopped
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import template_kwargs
from gspo_cli.models import load_policy
from gspo_cli.models.loading import convert_first
from gspo_cli.models.lora import Adapters
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import EngineSpec, RolloutEngine
from gspo_cli.rollout.engines import base_rollout_engine
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    COLD_START,
    TEACHER_FILES,
    judge_cache_file,
    step_folder,
)
from gspo_cli.runs.retention import Retention
from gspo_cli.train.async_rollouts.trainer import AsyncRollouts
from gspo_cli.train.engines.adapters import (
    base_name,
    base_sha256,
    save_builtin_base,
    trainable_line,
)
from gspo_cli.train.engines.build import check_processes, make_engine
from gspo_cli.train.engines.device import resolve_device
from gspo_cli.train.engines.distributed import (
    DistContext,
    check_world_size,
    context_from_env,
    init_process_group,
)
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TrainEngine
from gspo_cli.train.run.checkpoint import latest_checkpoint, save_checkpoint
from gspo_cli.train.run.cold_start import load_recipe_model, run_cold_start
from gspo_cli.train.run.environments import RunEnvironments, any_tools, load_environments
from gspo_cli.train.run.folder import prepare_run_dir
from gspo_cli.train.run.guard import rollback_target
from gspo_cli.train.run.log import RunLog
from gspo_cli.train.run.problem_sets import Problems
from gspo_cli.train.run.reference import BaseReference, reference_state
from gspo_cli.train.run.resume import resume_changes, resume_from_checkpoint
from gspo_cli.train.run.signals import StopRequest
from gspo_cli.train.run.state import RunState
from gspo_cli.train.run.step_settings import step_settings
from gspo_cli.train.run.teacher import check_teacher, load_teacher, record_teacher
from gspo_cli.train.run.trackers import start_trackers
from gspo_cli.train.step.distill import Teacher
from gspo_cli.train.step.environments import (
    StepEnvironment,
    close_environments,
    open_environments,
)
from gspo_cli.train.step.sampler import MixtureSampler
from gspo_cli.train.step.settings import StepSettings


@dataclass
class PreparedRun:
    recipe: Recipe
    ctx: DistContext
    device: torch.device
    run_dir: Path
    console: Console
    tokenizer: PreTrainedTokenizerBase
    environments: RunEnvironments  # their problems, held-out sets and weights
    engine: TrainEngine
    rollout_engine: RolloutEngine  # the run's one engine (the environments wrap it for tools)
    ref_engine: FrozenPolicy | None
    step_environments: list[StepEnvironment]  # each with its rewards and sampling
    math_pool: MathVerifierPool
    sampler: MixtureSampler
    log: RunLog
    settings: StepSettings
    state: RunState  # where the run is; `start` is its step when the loop began
    stop: StopRequest  # set by SIGTERM; see stop_at_boundary
    start: int = 0  # the last step already done when this process began (0 for a new run)
    rollouts: AsyncRollouts | None = None  # rollout.max_staleness > 0: the rollout worker
    teacher: Teacher | None = None  # algorithm.distill: the frozen teacher

    @property
    def train_set(self) -> Problems:
        """Every environment's training problems, one after the other."""
        return self.environments.train

    @property
    def eval_problems(self) -> list[Problem]:
        """Every environment's held-out problems."""
        return [p for env in self.environments.environments for p in env.heldout]

    def close(self) -> None:
        if self.rollouts is not None:
            self.rollouts.close()
        self.log.close()
        close_environments(self.step_environments)  # users' reward functions' workers
        self.math_pool.close()
        self.rollout_engine.close()

    def save_checkpoint(self, step: int, in_flight: bool = True) -> Path:
        """Checkpoint `step`: weights, optimizer, sampler position and RNG (all ranks call it);
        with asynchronous rollouts and `in_flight`, the batches sampled ahead (waited for)."""
        state = self.state.trainer_state(self.sampler, self.ctx.world, self.recipe.optimizer.lr)
        if self.ctx.is_main:  # only the main rank writes the trainer state: no copies elsewhere
            state.update(
                reference_state(self.ref_engine, self.recipe.algorithm.ref_update_every, step)
            )
        trainer = self.recipe.trainer
        return save_checkpoint(
            self.run_dir / CHECKPOINTS,
            step,
            self.engine,
            self.tokenizer,
            state,
            Retention(
                trainer.keep_checkpoints,
                trainer.keep_best,
                trainer.best_metric,
                trainer.best_mode,
                trainer.keep_every,
            ),
            self.ctx,
            # what a rollback after the next steps restores must survive pruning
            keep_before=rollback_target(step + 1) if trainer.on_collapse == "rollback" else None,
            extra=None if self.rollouts is None or not in_flight else self.rollouts.saver(step),
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
            # not waiting for batches sampled ahead: a stop is asked to be quick (and a stop of
            # the whole job may have ended the worker); the resume samples them afresh
            self.save_checkpoint(step, in_flight=False)
        raise Stopped(self.stop.signum or signal.SIGTERM)


def prepare_run(
    recipe: Recipe,
    recipe_yaml: str,
    run_dir: Path,
    resume: bool,
    console: Console | None,
    stop: StopRequest | None = None,
) -> PreparedRun:
    """Processes, run folder `run_dir` (resolved once, by the command), model (after the cold
    start), engines, rewards and resume state.

    `stop` is the SIGTERM request the loop polls (`stop_on_signals`); None: never set."""
    ctx, device = _processes(recipe)
    plain = Console(markup=False, highlight=False)  # paths and values print verbatim
    console = (console or plain) if ctx.is_main else Console(quiet=True)
    # a GGUF (or a LoRA checkpoint's GGUF base) is converted or refused before the run folder
    convert_first(recipe.model.path, what="model.path")
    check_teacher(recipe)  # a teacher with other token ids: refused before the run folder
    changes = _open_run_dir(run_dir, resume, recipe, recipe_yaml, ctx)
    console.print(f"run folder: {run_dir}", highlight=False)  # first, so a user can look in
    for line in changes:
        console.print(line, highlight=False, soft_wrap=True)
    teacher = load_teacher(recipe, device, console)
    torch.manual_seed(recipe.trainer.seed)
    model, tokenizer = load_recipe_model(recipe)
    environments = load_environments(recipe, tokenizer)
    for line in environments.notes:
        console.print(line, highlight=False, soft_wrap=True)
    sft_set = environments.cold_start_set()
    model = _after_cold_start(recipe, model.to(device), tokenizer, sft_set, run_dir, ctx, console)
    model.to(device)
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    ref_engine = _reference(recipe, model)
    save_builtin_base(recipe, model, tokenizer, run_dir, ctx)  # LoRA on a seeded built-in
    engine = make_engine(recipe.trainer.engine, model, engine_settings(recipe), ctx)
    if engine.adapters is not None:
        ref_engine = _lora_start(recipe, engine, engine.adapters, run_dir, console)
    rollout_engine, spec = _rollout_engine(recipe, engine, tokenizer, ctx)
    math_pool = MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s)
    services = _reward_services(math_pool, run_dir, ctx.rank, device)
    step_environments = open_environments(environments.plans(), rollout_engine, spec, services)
    sampler = environments.sampler(recipe)
    log = RunLog(run_dir, enabled=ctx.is_main)
    state = RunState()
    if resume:
        state = resume_from_checkpoint(
            run_dir, recipe, engine, sampler, log, ref_engine, ctx, console
        )
    if ctx.is_main:  # after the resume: a tracker continues from the checkpoint's step
        log.trackers = start_trackers(recipe, run_dir, state.step, console)
    else:
        torch.manual_seed(recipe.trainer.seed)
    settings = step_settings(recipe, int(tokenizer.pad_token_id), ctx.world)
    return PreparedRun(
        recipe, ctx, device, run_dir, console, tokenizer, environments, engine,
        rollout_engine, ref_engine, step_environments, math_pool, sampler, log, settings, state,
        stop or StopRequest(), state.step, teacher=teacher,
    )  # fmt: skip


def _processes(recipe: Recipe) -> tuple[DistContext, torch.device]:
    """This process's place among the launcher's and its device; the process group joined."""
    ctx = context_from_env()
    device = resolve_device(recipe.trainer.device, ctx.local_rank)
    if device.type == "cpu":  # save_pretrained imports DeepSpeed, which would probe for a GPU
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # and warn (the rollout worker inherits)
    check_processes(recipe.trainer.engine, ctx.world)
    check_world_size(recipe, ctx.world)
    if recipe.data.curriculum.enabled and recipe.rollout.max_staleness and ctx.world > 1:
        # each rank's rollout worker would judge only its own share of the prompts
        raise GspoError(
            "data.curriculum with rollout.max_staleness needs one process: the ranks' rollout "
            "workers see only their own groups (or set max_staleness 0)"
        )
    if TRAIN_ENGINES.get(recipe.trainer.engine).several_processes:
        init_process_group(ctx, device)
    return ctx, device


def _rollout_engine(
    recipe: Recipe, engine: TrainEngine, tokenizer: PreTrainedTokenizerBase, ctx: DistContext
) -> tuple[RolloutEngine, EngineSpec]:
    """This process's rollout engine, on the training engine's model, without tools (each
    environment wraps it with its own), and the spec it was built from."""
    synced = engine.partitions_weights and ctx.world > 1
    local = _local_rollout_engine(recipe, synced)
    spec = EngineSpec(
        engine.model,
        tokenizer,
        engine.full_weights,
        seed=recipe.trainer.seed + ctx.rank,
        synced_gpus=synced,
        options=recipe.rollout.vllm.model_dump(),
        capabilities=engine.capabilities,
        tools=any_tools(recipe),
        model_name=recipe.model.path,
        chat_template_kwargs=template_kwargs(recipe.data),
    )
    return base_rollout_engine(local, spec), spec


def _reward_services(
    math_pool: MathVerifierPool, run_dir: Path, rank: int, device: torch.device
) -> RewardServices:
    """The rewards' shared workers; judges and reward models run on the trainer's device and
    keep their answers in the run folder (a resume asks nothing twice)."""
    context = RewardContext(run_dir / judge_cache_file(rank), str(device))
    return RewardServices(math_pool=math_pool, reward_context=context)


def _local_rollout_engine(recipe: Recipe, synced: bool) -> str:
    """The rollout engine this process builds: the recipe's, or with asynchronous rollouts
    (which sample in the worker) HF for held-out evals on the policy itself."""
    local = "hf" if recipe.rollout.max_staleness else recipe.rollout.engine
    shares_weights = not ROLLOUT_ENGINES.get(local).keeps_own_weights
    if synced and shares_weights and any_tools(recipe) is not None:
        # ZeRO-3's (and expert parallelism's) generate runs every forward on every rank
        # together, and tool trajectories take as many turns as their own calls: the ranks
        # would wait on each other
        raise GspoError(
            "rollout.tools with DeepSpeed ZeRO-3 or expert parallelism on several processes "
            "needs rollout.engine vllm (or deepspeed.zero_stage 2 and expert_parallel 1)"
        )
    return local


def _open_run_dir(
    run_dir: Path, resume: bool, recipe: Recipe, recipe_yaml: str, ctx: DistContext
) -> list[str]:
    """Make the run folder ready; on resume, the lines that say which settings changed."""
    changes: list[str] = []
    if ctx.is_main:
        changes = resume_changes(run_dir, recipe_yaml) if resume else []
        prepare_run_dir(run_dir, resume, recipe_yaml)  # refuses what may not change
        if not (resume and (run_dir / TEACHER_FILES).is_file()):
            record_teacher(recipe, run_dir)  # what a resume checks the teacher's files against
    ctx.barrier()
    return changes


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
    """A frozen copy of the starting policy, only when the KL penalty is on (and LoRA is off:
    `_lora_start` gives the reference then)."""
    if recipe.algorithm.kl_coef == 0 or recipe.model.lora.r:
        return None
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    return FrozenPolicy(frozen, recipe.trainer.share_prompts)


def _lora_start(
    recipe: Recipe, engine: TrainEngine, adapters: Adapters, run_dir: Path, console: Console
) -> FrozenPolicy | None:
    """A LoRA run's start: its checkpoints name their base, it says what trains, and the KL
    reference (when the penalty is on) is the base: the engine's model with adapters off."""
    adapters.name_base(base_name(recipe, run_dir), base_sha256(recipe))
    console.print(trainable_line(adapters, recipe.model.lora), highlight=False, soft_wrap=True)
    return BaseReference(engine, adapters) if recipe.algorithm.kl_coef else None
