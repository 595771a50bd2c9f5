"""Process-group helpers: who am I, sums across ranks, and metric reduction.

One process (the plain-torch engine) uses `LOCAL`, whose operations are identities, so the RL
step has a single code path for any world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gspo_cli.errors import GspoError
from gspo_cli.recipe.schema import Recipe
from gspo_cli.train.metric_rules import combine


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

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Means of means, min of mins, max of maxes, sums of counts; throughput summed."""
        if not self.active:
            return metrics
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, metrics)
        out: dict[str, float] = {}
        for key in dict.fromkeys(k for g in gathered for k in g):  # every rank's keys, in order
            holders = [g for g in gathered if key in g]  # a rank that trained no row lacks some
            weights = [float(g["response_tokens"]) for g in holders]
            out[key] = combine(key, [float(g[key]) for g in holders], weights)
        out["tokens_per_s"] = out["completion_tokens"] / max(out["time_step_s"], 1e-9)
        return out


LOCAL = DistContext()


def check_world_size(recipe: Recipe, world: int) -> None:
    """Every rank must get whole groups and the same whole number of micro-batches."""
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
    local = r.num_prompts * r.group_size // recipe.algorithm.minibatches // world
    micro = recipe.trainer.micro_batch_size
    if micro and local % micro:
        raise GspoError(
            f"trainer.micro_batch_size ({micro}) must divide each rank's minibatch ({local} "
            f"sequences with {world} processes)"
        )


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
    import deepspeed

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a local process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
