"""Building the rollout engine `rollout.engine` names (listed in core/engine_catalogue.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES
from gspo_cli.rollout.base import EngineSpec, RolloutEngine

if TYPE_CHECKING:
    from gspo_cli.rollout.hf import HFGenerateEngine
    from gspo_cli.rollout.vllm import VLLMEngine


def hf_engine(spec: EngineSpec) -> HFGenerateEngine:
    from gspo_cli.rollout.hf import HFGenerateEngine

    return HFGenerateEngine(
        spec.model, spec.tokenizer, synced_gpus=spec.synced_gpus, capabilities=spec.capabilities
    )


def vllm_engine(spec: EngineSpec) -> VLLMEngine:
    from gspo_cli.rollout.vllm import VLLMEngine  # imports vllm: only when chosen

    return VLLMEngine(spec)


def make_rollout_engine(name: str, spec: EngineSpec) -> RolloutEngine:
    """The engine `name`; with `spec.tools`, wrapped to return tool trajectories."""
    build = ROLLOUT_ENGINES.get(name).load()
    engine: RolloutEngine = build(spec)
    if spec.tools is None:
        return engine
    from gspo_cli.rollout.tools.build import make_tool_parts
    from gspo_cli.rollout.tools.trajectory import ToolUseEngine

    fmt, make_toolbox = make_tool_parts(
        spec.tools, spec.tokenizer, spec.model_name, spec.chat_template_kwargs
    )
    return ToolUseEngine(engine, spec.tokenizer, spec.tools, fmt, make_toolbox)
