"""The recipe's `environments`: one policy trained on several tasks, each a unit of its own.

An environment bundles its data (training and held-out), its reward functions with weights, its
tools and its own sampling (docs/environments.md). Today's single-task keys are the one-entry
case: a recipe without `environments` is one environment made of `data`, `reward.functions` and
`rollout.tools` (`environment_views`), so the run has one code path for both.

Each environment is resolved into a *view* (`environment_views` in recipe/schema.py): the whole
recipe with that environment's keys put in place (its `data` keys over the recipe's `data`, its
reward functions, tools, response budget and held-out sizes), validated as a recipe is, so that
every reader of a recipe (prompt rendering, rewards, held-out evaluation) reads an environment
without knowing of environments.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from gspo_cli.recipe.reward import RewardFunctionConfig
from gspo_cli.recipe.rollout import ToolsConfig
from gspo_cli.recipe.section import Section

# The single-task recipe's one environment: the name its metrics would carry.
DEFAULT_ENVIRONMENT = "main"
# Names go into metric keys (env/NAME/reward_mean) and file names: plain characters only.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The `data` keys an environment may set: what differs between tasks. The rest (chat template,
# prompt length, seed) is the policy's and stays the recipe's.
ENVIRONMENT_DATA_KEYS = (
    "source",
    "split",
    "eval_source",
    "eval_split",
    "prompt_column",
    "answer_column",
    "prompt_template",
    "system_prompt",
    "heldout_size",
    "arithmetic",
    "reasoning_gym",
)
# What a single-task recipe sets that a recipe with `environments` takes from each entry.
PER_ENVIRONMENT_KEYS = {
    "data": ("source", "eval_source", "split", "eval_split"),
    "rollout": ("tools",),
}


class EnvironmentEvalConfig(Section):
    num_problems: int | None = Field(
        None, ge=1, description="Held-out problems of this environment; None: eval.num_problems."
    )
    samples: int | None = Field(
        None, ge=1, description="Samples per held-out problem; None: eval.samples."
    )


class EnvironmentConfig(Section):
    name: str = Field(description="Unique name: metrics are env/NAME/...")
    id: str | None = Field(
        None,
        description="An environment the ecosystem wrote, run unchanged: 'openenv:module:app' "
        "(an OpenEnv app gspo serves) or 'openenv:http://host:port' (a running server). Its "
        "action is the tool `step` and its rewards are the reward (docs/environments.md).",
    )
    weight: float = Field(
        1.0,
        ge=0,
        description="Its share of each step's prompts (weights need not sum to 1; 0 = only "
        "evaluated, never trained on).",
    )
    weight_final: float | None = Field(
        None,
        ge=0,
        description="Its weight at the last step: the weight moves linearly from `weight` (step "
        "1) to this (trainer.steps); None: fixed.",
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description="Its data keys over the recipe's `data`: source, eval_source, splits, "
        "columns, prompt_template, system_prompt, heldout_size, arithmetic, reasoning_gym.",
    )
    reward: list[RewardFunctionConfig] | None = Field(
        None, description="Its reward functions with weights; None: reward.functions."
    )
    tools: ToolsConfig | None = Field(
        None, description="Its tools (as rollout.tools; docs/tools.md); None: no tools."
    )
    max_new_tokens: int | None = Field(
        None, ge=1, description="Its response budget; None: rollout.max_new_tokens."
    )
    temperature: float | None = Field(
        None,
        gt=0,
        description="Its sampling temperature (the trainer scores its rows at it too); None: "
        "rollout.temperature.",
    )
    cold_start: bool = Field(
        True,
        description="Its training rows join the cold start's SFT data when cold_start is "
        "enabled (they need a target: a solution column, or cold_start.target answer).",
    )
    eval: EnvironmentEvalConfig = Field(
        default_factory=EnvironmentEvalConfig, description="Its held-out set's sizes."
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not NAME_PATTERN.match(name):
            raise ValueError(
                f"environment name {name!r}: letters, digits, '_', '.', '-' (it names metrics)"
            )
        return name

    @field_validator("id")
    @classmethod
    def _known_kind(cls, value: str | None) -> str | None:
        if value is None:
            return value
        kind, _, target = value.partition(":")
        if kind == "openenv" and target:
            return value
        if kind == "verifiers":
            raise ValueError(
                f"id {value!r}: verifiers environments are not supported yet (verifiers 0.4.0 "
                "runs its own agents through an OpenAI-style server; docs/environments.md)"
            )
        raise ValueError(f"id {value!r}: write openenv:module:app or openenv:http://host:port")

    @model_validator(mode="after")
    def _one_openenv(self) -> EnvironmentConfig:
        if self.id is not None and self.tools is not None and self.tools.openenv is not None:
            raise ValueError("id and tools.openenv both name a server: keep the id")
        return self

    def tool_keys(self) -> dict[str, Any] | None:
        """Its `rollout.tools` as written by hand: its `tools`, and what its `id` implies (the
        server's action as the one tool, in the chat template's calls)."""
        given = None if self.tools is None else self.tools.model_dump(exclude_unset=True)
        if self.id is None:
            return given
        target = self.id.partition(":")[2]
        return {"format": "chat_template", "interpreter": None, **(given or {}), "openenv": target}

    def reward_keys(self) -> list[dict[str, Any]] | None:
        """Its reward functions as written; with an `id` and none written, the environment's."""
        if self.reward is not None:
            return [f.model_dump(exclude_unset=True) for f in self.reward]
        return None if self.id is None else [{"name": "environment"}]

    @field_validator("data")
    @classmethod
    def _known_data_keys(cls, data: dict[str, Any]) -> dict[str, Any]:
        unknown = [key for key in data if key not in ENVIRONMENT_DATA_KEYS]
        if unknown:
            raise ValueError(
                f"data.{unknown[0]} is not a per-environment key (the recipe's data section "
                f"holds it); per-environment keys: {', '.join(ENVIRONMENT_DATA_KEYS)}"
            )
        return data
