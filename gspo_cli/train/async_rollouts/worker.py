"""The rollout worker of asynchronous rollouts (`rollout.max_staleness` N > 0): its own process.

It samples and scores the batch of every step s, in step order, from the policy after step
`WorkerPlan.version_for(s)` = max(start, s - 1 - N): while the trainer trains step k, the
worker samples steps k+1..k+N, and no batch lags the policy it trains by more than N versions.
The schedule is fixed, not "whatever weights are newest", so a batch depends only on its
step, its seed and its data position, never on timing: a resumed run regenerates exactly what
the uninterrupted one would have.

Weights travel through a staging model in shared memory that the trainer writes after each
step (train/async_rollouts/trainer.py); the worker copies it into its own model before the batch
that needs that version, and says so, after which the trainer may overwrite it.

Messages, each (kind, value); batches travel pickled, so their tensors never become
shared-memory handles:
- trainer -> worker: ("version", v): the staging model holds the weights after step v;
  ("stop", None): close the engine and the reward pools, and end.
- worker -> trainer: ("ready", None): engine and rewards built; ("took", v): version v
  copied; ("batch", bytes of an AsyncBatch); ("error", line): the worker ended on this problem.
"""

from __future__ import annotations

import copy
import pickle
import signal
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.core.workers import pool_worker_init
from gspo_cli.data.prompts import template_kwargs
from gspo_cli.models.forward.capabilities import ModelCapabilities
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import EngineSpec
from gspo_cli.rollout.engines import base_rollout_engine
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.step.collection import Collected, PromptSource, collect_step, step_seed
from gspo_cli.train.step.environments import (
    EnvironmentPlan,
    close_environments,
    open_environments,
)
from gspo_cli.train.step.sampler import MixtureSampler
from gspo_cli.train.step.settings import StepSettings


@dataclass
class AsyncBatch:
    """One step's batch, with what an exact resume needs to place it."""

    step: int
    version: int  # the policy that sampled it: the weights after this many steps
    collected: Collected
    sampler_before: dict[str, Any]  # the data position it drew from
    sampler_after: dict[str, Any]


@dataclass
class WorkerPlan:
    """What one worker samples: steps first_step..last_step of this rank's share."""

    recipe: Recipe
    problems: tuple[list[list[int]], list[dict[str, Any]]]  # the training set's (prompts, rows)
    environments: list[EnvironmentPlan]
    sampler: MixtureSampler  # the run's, at any position (`sampler_state` sets it)
    tokenizer: PreTrainedTokenizerBase
    settings: StepSettings
    ctx: DistContext  # this rank's place (no process group: the worker runs no collective)
    capabilities: ModelCapabilities | None
    device: str
    first_step: int
    last_step: int
    start_version: int  # the staging model's version when the worker starts
    rollbacks: int  # they enter the sampling seeds, as in the synchronous loop
    sampler_state: dict[str, Any]  # the data position of first_step's batch
    parent_pid: int

    def version_for(self, step: int) -> int:
        """The policy version that samples step `step`'s batch."""
        return max(self.start_version, step - 1 - self.recipe.rollout.max_staleness)


def load_staging(model: nn.Module, staging: dict[str, torch.Tensor]) -> None:
    """Copy the staging weights into `model` (names as in its state dict)."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(staging[name])


def worker_main(plan: WorkerPlan, staging: nn.Module, inbox: Any, outbox: Any) -> None:
    """The worker process's entry point (spawned by train/async_rollouts/trainer.py)."""
    # dies with the trainer, and its own children (reward pools, vLLM's engine) with it
    pool_worker_init(plan.parent_pid)
    # a SIGTERM to every process of a job (a scheduler's stop) is the trainer's to handle: it
    # checkpoints at the next step boundary, and ends the worker itself
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(plan.recipe.rollout.worker_threads)
    try:
        _sample(plan, staging, inbox, outbox)
    except GspoError as exc:
        outbox.put(("error", str(exc)))
    except Exception as exc:  # a worker traceback would reach no one: send one line
        outbox.put(("error", f"{type(exc).__name__}: {exc}"))


def _sample(plan: WorkerPlan, staging: nn.Module, inbox: Any, outbox: Any) -> None:
    recipe = plan.recipe
    model = copy.deepcopy(staging).to(torch.device(plan.device)).eval()  # private weights
    shared = staging.state_dict()
    spec = EngineSpec(
        model,
        plan.tokenizer,
        lambda: model.state_dict().items(),
        seed=recipe.trainer.seed + plan.ctx.rank,
        options=recipe.rollout.vllm.model_dump(),
        capabilities=plan.capabilities,
        tools=next((p.tools for p in plan.environments if p.tools is not None), None),
        model_name=recipe.model.path,
        chat_template_kwargs=template_kwargs(recipe.data),
    )
    engine = base_rollout_engine(recipe.rollout.engine, spec)
    sampler = plan.sampler
    sampler.load_state_dict(plan.sampler_state)
    version = published = plan.start_version
    try:
        with MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s) as pool:
            environments = open_environments(
                plan.environments, engine, spec, RewardServices(math_pool=pool)
            )
            source = PromptSource(*plan.problems, sampler, environments)
            outbox.put(("ready", None))
            try:
                for step in range(plan.first_step, plan.last_step + 1):
                    need = plan.version_for(step)
                    while published < need:  # versions arrive in order
                        kind, value = inbox.get()
                        if kind == "stop":  # batches still queued are of no use now
                            outbox.cancel_join_thread()
                            return
                        published = value
                    if need != version:
                        load_staging(model, shared)
                        version = need
                        outbox.put(("took", version))
                    seed = step_seed(recipe.trainer.seed, step, plan.rollbacks)
                    torch.manual_seed(seed)  # unseeded sampling: one stream per step
                    before = sampler.state_dict()
                    collected = collect_step(
                        source,
                        plan.settings,
                        seed,
                        plan.ctx,
                        note=lambda line, step=step: outbox.put(("note", f"step {step}: {line}")),
                        step=step,
                    )
                    batch = AsyncBatch(step, version, collected, before, sampler.state_dict())
                    outbox.put(("batch", pickle.dumps(batch)))
            finally:
                close_environments(environments)
    finally:
        engine.close()
