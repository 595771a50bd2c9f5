"""The recipe's reward section: the reward functions, their workers and the code sandbox."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.recipe.section import Section


class RewardFunctionConfig(Section):
    name: str = Field(
        description="A registered reward (math, code) or your own function as module:function."
    )
    weight: float = Field(1.0, allow_inf_nan=False, description="Weight of this reward in the sum.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The function's keyword-only options, e.g. {partial_credit: true} for code.",
    )
    none_as: float | Literal["skip"] | None = Field(
        None,
        description="What a None score means: a number, or skip (not scored: adds nothing, left "
        "out of its mean); unset: None is an error.",
    )

    @field_validator("none_as", mode="before")
    @classmethod
    def _none_as(cls, value: Any) -> Any:
        from gspo_cli.rewards.contract import parse_none_as

        return parse_none_as(value)

    @model_validator(mode="after")
    def _bind_options(self) -> RewardFunctionConfig:
        from gspo_cli.rewards.binding import check_options, resolve_reward
        from gspo_cli.rewards.contract import check_options_together

        fn = resolve_reward(self.name)
        checked = check_options(self.name, fn, self.options)
        check_options_together(fn, checked, self.none_as)  # e.g. a judge's template and mode
        if checked != self.options:
            self.options = checked
        return self


class HeldoutJudgeConfig(Section):
    every: int = Field(
        ..., ge=1, description="Judge held-out prompts' responses every N steps (and the last)."
    )
    options: dict[str, Any] = Field(
        ..., description="The `judge` reward's options (model, template, parse...): docs/judges.md."
    )

    @model_validator(mode="after")
    def _check(self) -> HeldoutJudgeConfig:
        from gspo_cli.rewards.binding import check_options, resolve_reward
        from gspo_cli.rewards.contract import check_options_together

        fn = resolve_reward("judge")
        checked = check_options("judge", fn, self.options)
        check_options_together(fn, checked, "skip")  # its mean leaves skipped ones out
        if checked != self.options:  # assignment validates again: only when it changes
            self.options = checked
        return self


class SandboxConfig(Section):
    allow_weak_isolation: bool = Field(
        False,
        description="Judge code without bubblewrap (unshare or rlimits isolation), if need be.",
    )


class RewardConfig(Section):
    functions: list[RewardFunctionConfig] = Field(
        default_factory=lambda: [RewardFunctionConfig(name="math")],
        min_length=1,
        description="Reward functions, summed with their weights.",
    )
    num_workers: int = Field(2, ge=1, description="Processes that score completions.")
    timeout_s: float = Field(
        5.0,
        gt=0,
        description="Seconds per completion (not per call or step): each maths check; a call "
        "of your own function on N completions gets N x this, and says every 30 s that it is "
        "still running.",
    )
    heldout_judge: HeldoutJudgeConfig | None = Field(
        None,
        description="Another judge scoring held-out prompts' responses beside the training "
        "judge (judge_heldout/mean, judge_train/mean): judge hacking shows as the two part.",
    )
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="The code sandbox's isolation policy."
    )
    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO soft overlong punishment: the last N tokens before "
        "rollout.max_new_tokens, over which a penalty grows linearly to overlong_penalty; 0 = off.",
    )
    overlong_penalty: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="The overlong penalty subtracted from the reward at rollout.max_new_tokens.",
    )

    @model_validator(mode="after")
    def _penalty_needs_a_buffer(self) -> RewardConfig:
        # A penalty without a buffer would be silently ignored: say so instead.
        default = type(self).model_fields["overlong_penalty"].default
        if self.overlong_buffer == 0 and self.overlong_penalty != default:
            raise ValueError(
                f"reward.overlong_penalty {self.overlong_penalty:g} has no effect with "
                "overlong_buffer 0: set overlong_buffer > 0"
            )
        return self
