"""Which training and rollout engines exist, and what each one can do.

`trainer.engine` and `rollout.engine` name an entry here. Code that must behave differently for
an engine asks the entry a question (`TRAIN_ENGINES.get(name).several_processes`), never compares
its name. Each engine's class loads only when it is built (`build` is "module:attribute"), so
that the recipe can check names without importing DeepSpeed or vLLM.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from gspo_cli.core.registry import Registry


def _load(location: str) -> Any:
    module, _, attribute = location.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class TrainEngineKind:
    """A training engine: `build(model, settings, ctx)` and what it can do."""

    build: str  # "module:attribute" of the engine's class
    several_processes: bool  # runs under torchrun/the DeepSpeed launcher (a process group)
    # splits a MoE model's experts over processes (deepspeed.expert_parallel > 1)
    expert_parallel: bool = False

    def load(self) -> Any:
        return _load(self.build)


@dataclass(frozen=True)
class RolloutEngineKind:
    """A rollout engine: `build(spec)` and what it can do."""

    build: str  # "module:attribute" of a function from EngineSpec to the engine
    keeps_own_weights: bool  # a copy of the model, synced after each update (vLLM)
    returns_routed_experts: bool  # MoE: the experts each generated token went to
    runs_in_trainer: bool  # generates on the trainer's own model and memory (HF generate)
    # can run in the rollout worker process of asynchronous rollouts (rollout.max_staleness)
    runs_async: bool = False

    def load(self) -> Any:
        return _load(self.build)


TRAIN_ENGINES: Registry[TrainEngineKind] = Registry("training engine")
TRAIN_ENGINES.add(
    "torch",
    TrainEngineKind("gspo_cli.train.engines.torch_engine:TorchEngine", several_processes=False),
)
TRAIN_ENGINES.add(
    "deepspeed",
    TrainEngineKind(
        "gspo_cli.train.engines.deepspeed_engine:DeepSpeedEngine",
        several_processes=True,
        expert_parallel=True,
    ),
)

ROLLOUT_ENGINES: Registry[RolloutEngineKind] = Registry("rollout engine")
ROLLOUT_ENGINES.add(
    "hf",
    RolloutEngineKind(
        "gspo_cli.rollout.engines:hf_engine",
        keeps_own_weights=False,
        returns_routed_experts=True,
        runs_in_trainer=True,
        runs_async=True,
    ),
)
ROLLOUT_ENGINES.add(
    "vllm",
    RolloutEngineKind(
        "gspo_cli.rollout.engines:vllm_engine",
        keeps_own_weights=True,
        returns_routed_experts=False,
        runs_in_trainer=False,
        runs_async=True,
    ),
)


def multi_process_engines() -> str:
    """The training engines that run on several processes, for messages."""
    return " or ".join(n for n in TRAIN_ENGINES if TRAIN_ENGINES.get(n).several_processes)


def expert_parallel_engines() -> str:
    """The training engines that split a model's experts over processes, for messages."""
    return " or ".join(n for n in TRAIN_ENGINES if TRAIN_ENGINES.get(n).expert_parallel)
