"""The rollout-engine interface: every generation backend (HF transformers, vLLM) fits it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.tool_settings import ToolSettings

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gspo_cli.models.forward.capabilities import ModelCapabilities

Weights = Callable[[], Iterable[tuple[str, torch.Tensor]]]
Rows = Sequence[Mapping[str, Any]]  # one dataset row per prompt


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 64
    num_samples: int = 1  # responses per prompt (G)
    logprobs: bool = False  # also return each sampled token's log-prob (costs memory and time)
    routed_experts: bool = False  # MoE: also return the experts each forwarded token went to
    # A response may end right after the token that completes one of these strings (its
    # end-of-turn is not added): tool calls (rollout/tools/). () = only end-of-turn ends it.
    stop: tuple[str, ...] = ()


class RolloutEngine(Protocol):
    """Generates G responses per prompt with the current policy weights."""

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        rows: Rows | None = None,
    ) -> RolloutBatch:
        """`params.num_samples` responses per prompt; with `seeds`, prompt i's samples depend
        only on seeds[i] (not on batching or on which rank generates them). `rows`: prompt
        i's dataset row, for a tool environment's reset (engines without tools ignore it)."""
        ...

    def sync_weights(self) -> None:
        """Make the next `generate` use the trainer's latest weights (no-op when shared)."""
        ...

    def close(self) -> None:
        """Free what the engine holds (memory, worker threads, temporary folders)."""
        ...


@dataclass(frozen=True)
class EngineSpec:
    """What building a rollout engine needs (gspo_cli/core/engine_catalogue.py lists the engines).

    `weights` yields the trainer's full, current parameters by HF name (gathered under ZeRO-3):
    an engine that keeps its own copy of the model (vLLM) syncs from it. `capabilities`: the
    training engine's decision about the model's forward; None: decided from the model.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    weights: Weights
    seed: int = 0
    synced_gpus: bool = False  # HF under ZeRO-3 with several ranks
    options: dict[str, Any] = field(default_factory=dict)  # the engine's own recipe section
    capabilities: ModelCapabilities | None = None
    tools: ToolSettings | None = None  # rollout.tools: the engine returns tool trajectories
    model_name: str = "the model"  # names the model in a one-line refusal
    # the prompts' chat template variables (data.chat_template_kwargs): tool turns render alike
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
