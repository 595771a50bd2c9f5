"""The plain settings a training engine is built from: an engine never sees the recipe."""

from __future__ import annotations

from dataclasses import dataclass, field

from gspo_cli.recipe.inputs import LoraConfig
from gspo_cli.recipe.schema import Recipe
from gspo_cli.recipe.trainer import DeepSpeedConfig, OptimizerConfig


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What a training engine needs of the recipe (`engine_settings` builds it)."""

    optimizer: OptimizerConfig
    optimizer_steps: int  # the schedule's length: one per minibatch of every RL step
    share_prompts: bool = True  # trainer.share_prompts: where the model's capabilities allow
    rows_per_minibatch: int = 0  # rollout rows per optimiser step, all ranks (DeepSpeed's batch)
    micro_batch_size: int = 0  # trainer.micro_batch_size; 0: a whole minibatch
    bf16: bool = False  # model.dtype is bfloat16 (DeepSpeed's bf16 mode)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)  # read by DeepSpeed
    lora: LoraConfig = field(default_factory=LoraConfig)  # model.lora: r 0 = every weight trains


def optimizer_steps(recipe: Recipe) -> int:
    """Optimiser steps in the whole run: one per minibatch of every RL step."""
    return recipe.trainer.steps * recipe.algorithm.minibatches


def engine_settings(recipe: Recipe) -> EngineSettings:
    rows = recipe.rollout.num_prompts * recipe.rollout.group_size
    return EngineSettings(
        optimizer=recipe.optimizer,
        optimizer_steps=optimizer_steps(recipe),
        share_prompts=recipe.trainer.share_prompts,
        rows_per_minibatch=rows // recipe.algorithm.minibatches,
        micro_batch_size=recipe.trainer.micro_batch_size,
        bf16=recipe.model.dtype == "bfloat16",
        deepspeed=recipe.deepspeed,
        lora=recipe.model.lora,
    )
