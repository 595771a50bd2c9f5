"""The rollout-engine registry: `rollout.engine` names one; each loads its library lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gspo_cli.registry import Registry
from gspo_cli.rollout.base import RolloutEngine

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Weights = Callable[[], Iterable[tuple[str, "torch.Tensor"]]]


@dataclass(frozen=True)
class EngineSpec:
    """What building a rollout engine needs.

    `weights` yields the trainer's full, current parameters by HF name (gathered under ZeRO-3):
    an engine that keeps its own copy of the model (vLLM) syncs from it.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    weights: Weights
    seed: int = 0
    synced_gpus: bool = False  # HF under ZeRO-3 with several ranks
    options: dict[str, Any] = field(default_factory=dict)  # the engine's own recipe section


ROLLOUT_ENGINES: Registry[Callable[[EngineSpec], RolloutEngine]] = Registry("rollout engine")


@ROLLOUT_ENGINES.register("hf")
def _hf(spec: EngineSpec) -> RolloutEngine:
    from gspo_cli.rollout.hf import HFGenerateEngine

    return HFGenerateEngine(spec.model, spec.tokenizer, synced_gpus=spec.synced_gpus)


@ROLLOUT_ENGINES.register("vllm")
def _vllm(spec: EngineSpec) -> RolloutEngine:
    from gspo_cli.rollout.vllm import VLLMEngine

    return VLLMEngine(spec)


def make_rollout_engine(name: str, spec: EngineSpec) -> RolloutEngine:
    return ROLLOUT_ENGINES.get(name)(spec)
