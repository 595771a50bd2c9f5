"""Process-group helpers: who am I, sums across ranks, and metric reduction.

One process (the plain-torch engine) uses `LOCAL`, whose operations are identities, so the RL
step has a single code path for any world size.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from gspo_cli.core.engine_catalogue import TRAIN_ENGINES, expert_parallel_engines
from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.bounds import expert_count_problem
from gspo_cli.recipe.schema import Recipe
from gspo_cli.train.engines.metric_rules import (
    combine,
    mfu_metrics,
    rank_weight_key,
    tool_error_share,
)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1 and dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def all_reduce_sum(self, value: float) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor)
        return float(tensor.item())

    def all_reduce_max(self, value: float) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's (picklable) `value`, in rank order; `[value]` in one process."""
        if not self.active:
            return [value]
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Means of means, min of mins, max of maxes, sums of counts; throughput summed."""
        if not self.active:
            return metrics
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, metrics)
        out: dict[str, float] = {}
        for key in dict.fromkeys(k for g in gathered for k in g):  # every rank's keys, in order
            holders = [g for g in gathered if key in g]  # a rank that trained no row lacks some
            weights = [float(g[rank_weight_key(key)]) for g in holders]
            out[key] = combine(key, [float(g[key]) for g in holders], weights)
        out["tokens_per_s"] = out["completion_tokens"] / max(out["time_step_s"], 1e-9)
        out.update(mfu_metrics(out))  # from the summed FLOPs and peaks, not a mean of ratios
        out.update(tool_error_share(out))  # likewise from the summed tool calls and errors
        return out


LOCAL = DistContext()


def check_world_size(recipe: Recipe, world: int) -> None:
    """Every rank must get whole groups and the same whole number of micro-batches."""
    check_expert_parallel(recipe, world)
    if world == 1:
        return
    r = recipe.rollout
    if r.num_prompts % world:
        raise GspoError(
            f"rollout.num_prompts ({r.num_prompts}) must be a multiple of the number of "
            f"processes ({world}): ranks take whole groups"
        )
    if r.group_size % recipe.algorithm.minibatches:
        raise GspoError(
            "with several processes, algorithm.minibatches must divide rollout.group_size "
            "(each minibatch takes a share of every group)"
        )
    if r.max_staleness and r.dynamic_sampling:
        raise GspoError(
            "rollout.max_staleness with dynamic_sampling runs on one process only: each rank's "
            "rollout worker would need the other ranks' rewards between rounds (set "
            "max_staleness 0, or train on one process)"
        )
    local = r.num_prompts * r.group_size // recipe.algorithm.minibatches // world
    micro = recipe.trainer.micro_batch_size
    if micro and local % micro:
        raise GspoError(
            f"trainer.micro_batch_size ({micro}) must divide each rank's minibatch ({local} "
            f"sequences with {world} processes)"
        )


def check_expert_parallel(recipe: Recipe, world: int) -> None:
    """`deepspeed.expert_parallel` (AutoEP) where it can run, one line each (the expert count
    is checked where the model is known: at validate time, or `check_expert_count`)."""
    ep = recipe.deepspeed.expert_parallel
    if ep == 1:
        return
    if not TRAIN_ENGINES.get(recipe.trainer.engine).expert_parallel:
        raise GspoError(
            f"deepspeed.expert_parallel needs trainer.engine {expert_parallel_engines()}"
        )
    if world % ep:
        raise GspoError(
            f"deepspeed.expert_parallel ({ep}) must divide the number of processes ({world})"
        )
    if recipe.model.lora.r:
        raise GspoError(
            "deepspeed.expert_parallel does not run with LoRA (model.lora.r > 0): DeepSpeed's "
            "AutoEP replaces the expert modules the adapters would wrap"
        )


def check_expert_count(experts: int, ep: int) -> None:
    """The loaded model's routed experts per layer must split evenly over `ep` ranks (a
    known shape was checked at validate time: recipe/bounds.py)."""
    problem = expert_count_problem(experts, ep)
    if problem is not None:
        raise GspoError(problem)


def context_from_env() -> DistContext:
    """The launcher's (torchrun / deepspeed) RANK, WORLD_SIZE and LOCAL_RANK, or one process."""
    return DistContext(
        rank=int(os.environ.get("RANK", 0)),
        world=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )


def init_process_group(ctx: DistContext, device: torch.device) -> None:
    """Join the launcher's process group (gloo on CPU, NCCL on CUDA) through DeepSpeed."""
    if ctx.world == 1 and "MASTER_ADDR" not in os.environ:
        # DeepSpeed wants a process group even for one process: a private local one.
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
        )
    deepspeed = import_deepspeed(device)
    if not dist.is_initialized():
        skip_shm_op()
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")


def import_deepspeed(device: torch.device) -> ModuleType:
    """DeepSpeed, told the accelerator: on CPU it would otherwise probe for a GPU and warn
    "Setting accelerator to CPU. If you have GPU ... unable to detect it" on every rank."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return importlib.import_module("deepspeed")


# DeepSpeed's shared-memory op for CPU collectives serves only `inference_all_reduce`, which its
# tensor-parallel inference layers call and training never does (all_reduce goes through gloo).
# init_distributed would still JIT-build it (86 s on 2 cores, again in every new venv: the build
# keys on the venv's include paths) and load it in every rank.
SHM_OP = "deepspeed_shm_comm"


def skip_shm_op() -> None:
    """Tell DeepSpeed not to build SHM_OP: its table of compatible ops is what `build_shm_op`
    (deepspeed/comm/torch.py) reads, and DeepSpeed keeps edits to it."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_OP] = False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a local process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
