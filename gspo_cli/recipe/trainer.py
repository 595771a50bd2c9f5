"""The recipe's training sections: optimizer, cold start, the RL loop and DeepSpeed."""

from __future__ import annotations

from functools import partial
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.recipe.section import Section, check_exists, registered


class OptimizerConfig(Section):
    lr: float = Field(1e-6, gt=0, description="Peak AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up, in optimiser steps.")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Decay after warm-up."
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final lr as a share of lr.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")


class ColdStartConfig(Section):
    enabled: bool = Field(False, description="Supervised fine-tuning first (on `target`).")
    steps: int = Field(300, ge=1, description="SFT optimiser steps.")
    batch_size: int = Field(32, ge=1, description="Examples per SFT step.")
    lr: float = Field(1e-3, gt=0, description="SFT learning rate (cosine decay, 5% warm-up).")
    target: Literal["solution", "answer"] = Field(
        "solution",
        description="What it imitates: each row's worked `solution`, or (`answer`, for data "
        "with none, such as most reasoning-gym tasks) the reference answer alone in the "
        "expected form, `\\boxed{answer}`: that teaches the form, not the working.",
    )


class TrainerConfig(Section):
    steps: int = Field(100, ge=1, description="RL steps (one rollout batch each).")
    engine: str = Field(
        "torch", description="Training engine: torch (one process) or deepspeed (many)."
    )
    micro_batch_size: int = Field(
        0, ge=0, description="Sequences per forward/backward; 0 = a whole minibatch at once."
    )
    max_tokens_per_micro_batch: int = Field(
        0,
        ge=0,
        description="Tokens computed per forward/backward, padding included (rows x longest "
        "prompt + response; with share_prompts, distinct prompts x longest prompt + rows x "
        "longest response); rows are length-bucketed under it. 0 = no budget.",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="Leave responses whose advantage is exactly 0 out of every forward and "
        "backward (the gradient is unchanged; off automatically with a KL or router aux term).",
    )
    share_prompts: bool = Field(
        True,
        description="Run each distinct prompt of a micro-batch once and its responses on its "
        "cached keys/values (dense full-attention models with a plain LM head; the gradient is "
        "unchanged up to float rounding).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to train.")
    seed: int = Field(0, description="Seed of sampling, initialisation and shuffling.")
    out_dir: str = Field("runs", description="Parent folder of run folders.")
    checkpoint_every: int = Field(50, ge=1, description="Save a checkpoint every N steps.")
    keep_checkpoints: int = Field(2, ge=1, description="The newest N checkpoints are kept.")
    keep_best: int = Field(
        0, ge=0, description="Besides them, the best N by `best_metric` (0: none kept for it)."
    )
    best_metric: str = Field(
        "heldout_accuracy",
        description="A metrics.jsonl name that ranks checkpoints (its value at their step; "
        "heldout_accuracy is logged at held-out steps only).",
    )
    best_mode: Literal["max", "min"] = Field("max", description="Whether higher is better.")
    keep_every: int = Field(
        0, ge=0, description="Besides them, every checkpoint at a multiple of N steps (0: none)."
    )
    log_samples: int = Field(2, ge=0, description="Completions written to samples.jsonl per step.")
    max_bad_updates: int = Field(
        3, ge=1, description="Non-finite (skipped) updates in a row before the run stops."
    )
    on_collapse: Literal["warn", "stop", "rollback"] = Field(
        "stop",
        description="On a collapse signal (entropy, reward, ratio, held-out): warn, stop, or "
        "roll back to the last good checkpoint (docs/guards-and-reliability.md).",
    )
    rollback_lr_factor: float = Field(
        0.5, gt=0, le=1, description="Learning-rate multiplier applied at each rollback."
    )
    max_rollbacks: int = Field(2, ge=0, description="Rollbacks before a collapse stops the run.")
    stop_grace_s: float = Field(
        20.0,
        ge=0,
        description="On SIGTERM, stop at the next step boundary with a checkpoint if one comes "
        "within this many seconds, else stop at once (0: at once).",
    )

    _engine_registered = field_validator("engine")(partial(registered, "training engine"))


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="ZeRO stage.")
    offload_optimizer: bool = Field(False, description="Keep optimizer states in CPU memory.")
    offload_params: bool = Field(False, description="Keep parameters in CPU memory (ZeRO-3).")
    expert_parallel: int = Field(
        1,
        ge=1,
        description="Expert parallelism (DeepSpeed AutoEP): shard each MoE layer's experts "
        "over this many ranks (must divide the number of processes and the expert count; "
        "ZeRO 1-3, no LoRA). 1 = every rank holds every expert.",
    )
    config_file: str | None = Field(
        None,
        description="A DeepSpeed JSON to start from; batch, clipping, precision and optimizer "
        "keys come from the recipe and must not contradict it.",
    )

    _file_exists = field_validator("config_file")(check_exists)

    @model_validator(mode="after")
    def _offload_params_needs_zero3(self) -> DeepSpeedConfig:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("offload_params needs zero_stage 3")
        return self

    @model_validator(mode="after")
    def _expert_parallel_needs_zero(self) -> DeepSpeedConfig:
        if self.expert_parallel > 1 and self.zero_stage == 0:
            # ZeRO-0 clips with the mean of the ranks' local norms, each over its own experts
            raise ValueError(
                "expert_parallel needs zero_stage 1, 2 or 3 (ZeRO-0's gradient clipping "
                "would use each rank's norm over its own experts)"
            )
        return self
