"""Building the rollout engine `rollout.engine` names (listed in core/engine_catalogue.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES
from gspo_cli.rollout.base import EngineSpec, RolloutEngine
from gspo_cli.rollout.tool_settings import ToolSettings

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
    engine = base_rollout_engine(name, spec)
    return engine if spec.tools is None else with_tools(engine, spec, spec.tools)


def base_rollout_engine(name: str, spec: EngineSpec) -> RolloutEngine:
    """The engine `name` without the tool wrapper (`spec.tools` only says tools will wrap it,
    which vLLM prepares for): environments wrap it each with their own (`with_tools`)."""
    build = ROLLOUT_ENGINES.get(name).load()
    engine: RolloutEngine = build(spec)
    return engine


def with_tools(engine: RolloutEngine, spec: EngineSpec, tools: ToolSettings) -> RolloutEngine:
    """`engine` returning tool trajectories with `tools` (one environment's, in a mixture: the
    engine itself is shared, so closing the wrapper closes it)."""
    from gspo_cli.rollout.tools.build import make_tool_parts
    from gspo_cli.rollout.tools.trajectory import ToolUseEngine

    fmt, make_toolbox = make_tool_parts(
        tools, spec.tokenizer, spec.model_name, spec.chat_template_kwargs
    )
    return ToolUseEngine(engine, spec.tokenizer, tools, fmt, make_toolbox)
