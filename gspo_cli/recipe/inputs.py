"""The recipe's model and data sections: the policy a run starts from and the prompts it sees."""

from __future__ import annotations

from pathlib import Path
from string import Formatter
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.data.prompts import DEFAULT_TEMPLATE, check_template_kwargs
from gspo_cli.data.reasoning_gym import task_of, task_specs
from gspo_cli.recipe.section import Section, check_exists, looks_local
from gspo_cli.runs.folder import HF_CONFIG

# peft's name for every linear layer but the output head
LORA_ALL_LINEAR: Literal["all-linear"] = "all-linear"


class LoraConfig(Section):
    r: int = Field(
        0,
        ge=0,
        description="LoRA rank: train peft low-rank adapters of this rank on the frozen model "
        "(the cold-start result when enabled); 0 = off, every weight trains.",
    )
    alpha: float = Field(16.0, gt=0, description="LoRA alpha: the update is (alpha / r) B A.")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input while training; above 0 the on-policy ratio "
        "is no longer exactly 1.",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        LORA_ALL_LINEAR,
        min_length=1,
        description="Modules that get adapters, by name (q_proj, v_proj...; a name matches a "
        "module's last dotted parts), or all-linear: every linear layer but the LM head.",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _names_or_all_linear(cls, value: object) -> object:
        if isinstance(value, str) and value != LORA_ALL_LINEAR:
            raise ValueError(f"a list of module names ([{value}]) or {LORA_ALL_LINEAR}")
        return value

    @model_validator(mode="after")
    def _settings_need_a_rank(self) -> LoraConfig:
        # A LoRA setting without adapters would be silently ignored: say so instead.
        defaults = LoraConfig.model_fields
        keys = ("alpha", "dropout", "target_modules")
        changed = [k for k in keys if getattr(self, k) != defaults[k].get_default()]
        if self.r == 0 and changed:
            raise ValueError(f"{changed[0]} has no effect with r 0 (LoRA off): set r > 0")
        return self


class ModelConfig(Section):
    path: str = Field(
        "builtin:tiny-dense",
        description="HF checkpoint folder (a bare name is the folder next to the recipe when "
        "one exists), hub id, .gguf file (converted once to an HF folder in the cache), or a "
        "built-in model: builtin:tiny-dense / builtin:tiny-moe / builtin:tiny-moe-deep (tiny, "
        "randomly initialised) or builtin:smollm2-135m (SmolLM2-135M-Instruct, pretrained).",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Training dtype.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    trust_remote_code: bool = Field(False, description="Allow custom modelling code from the hub.")
    lora: LoraConfig = Field(
        default_factory=LoraConfig, description="LoRA adapters (peft); r 0 = off."
    )

    _path_exists = field_validator("path")(check_exists)

    @field_validator("path")
    @classmethod
    def _hf_folder(cls, path: str) -> str:
        """A local model folder must be an HF checkpoint: loading it fails otherwise, late."""
        local = Path(path).expanduser()
        if local.is_file() and local.suffix == ".gguf":
            return path  # models.gguf converts it (and reports a damaged file) when loading
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
    tool_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of worked solutions that compute in a ```python block and box its "
        "output (for rollout.tools; docs/tools.md).",
    )

    @model_validator(mode="after")
    def _check(self) -> ArithmeticTaskConfig:
        if self.max_ops < self.min_ops:
            raise ValueError(f"max_ops ({self.max_ops}) must be >= min_ops ({self.min_ops})")
        if set(self.operators) - set("+-*"):
            raise ValueError(f"operators must be drawn from '+-*', got {self.operators!r}")
        return self


class ReasoningGymTaskConfig(Section):
    weight: float = Field(
        1.0, gt=0, description="Its share of the mix (weights need not sum to 1)."
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="The task's own config keys (reasoning-gym's)."
    )


class ReasoningGymConfig(Section):
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="reasoning_gym:TASK's own config keys (e.g. chain_sum's max_terms); checked "
        "against the task's at validate time.",
    )
    tasks: dict[str, ReasoningGymTaskConfig] = Field(
        default_factory=dict,
        description="reasoning_gym:composite: the tasks mixed, by name: {weight, config}.",
    )
    size: int = Field(2000, ge=1, description="Training problems generated (before dropping).")
    eval_size: int = Field(200, ge=1, description="Held-out problems, from another seed.")
    seed: int | None = Field(
        None,
        description="Seed of the training problems; None: data.seed. Held-out problems "
        "use seed + 1000003.",
    )


class CurriculumConfig(Section):
    enabled: bool = Field(
        False,
        description="Set aside prompts that every sample (or none) solved on their last `visits` "
        "visits, for `set_aside_epochs` epochs (docs/environments.md).",
    )
    visits: int = Field(2, ge=1, description="K: a prompt is judged on its last K visits.")
    set_aside_epochs: int = Field(
        1, ge=1, description="N: epochs (of its environment's prompt order) it then sits out."
    )

    @model_validator(mode="after")
    def _settings_need_it_on(self) -> CurriculumConfig:
        # a setting of a curriculum that is off would be silently ignored: say so instead
        if not self.enabled and self.model_fields_set - {"enabled"}:
            key = sorted(self.model_fields_set - {"enabled"})[0]
            raise ValueError(f"{key} has no effect with enabled false: set enabled: true")
        return self


class DataConfig(Section):
    source: str = Field(
        "builtin:arithmetic",
        description="builtin:arithmetic, benchmark:NAME[:PATH], reasoning_gym:TASK (or "
        "reasoning_gym:composite), a local JSONL/JSON/Parquet file, or a datasets hub id.",
    )
    split: str = Field("train", description="Split to train on (files have only 'train').")
    eval_source: str | None = Field(
        None,
        description="Held-out data (same forms as source). None: the eval_split of source, or, "
        "for a source without splits (a local file, benchmark:), rows carved out of training.",
    )
    eval_split: str = Field("test", description="Split of eval_source used for held-out accuracy.")
    prompt_column: str = Field(
        "prompt",
        description="Column holding the question: text, or {role, content} messages (TRL's "
        "conversational format); a conversation ending with the assistant's turn (messages) is "
        "split into the prompt and the cold-start target.",
    )
    answer_column: str = Field(
        "answer",
        description="Column holding the reference answer; rows with a null answer (and no "
        "tests) are dropped and counted; numbers become text.",
    )
    prompt_template: str = Field(
        DEFAULT_TEMPLATE,
        description="Format string applied to each plain question before the chat template: "
        "{prompt} is the question, the only field; literal braces are doubled ({{ }}). The "
        "default is not applied to message prompts; any other goes into their last user turn.",
    )
    system_prompt: str | None = Field(
        None,
        description="A system turn put first in every prompt that has no system turn of its "
        "own; None: none.",
    )
    chat_template: Literal["auto", "none", "hermes"] = Field(
        "auto",
        description="auto: the tokenizer's chat template (an error when it has none); none: "
        "raw text (prompt_template applied), for base models without one; hermes: ChatML with "
        "Hermes tool calls in place of the model's, for ChatML models without tool support.",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the chat template wherever prompts are rendered, e.g. "
        "{enable_thinking: false} for Qwen3.",
    )
    max_prompt_tokens: int = Field(256, ge=8, description="Longer prompts are dropped.")
    arithmetic: ArithmeticTaskConfig = Field(
        default_factory=ArithmeticTaskConfig, description="Knobs of builtin:arithmetic."
    )
    reasoning_gym: ReasoningGymConfig = Field(
        default_factory=ReasoningGymConfig,
        description="reasoning_gym: sources: task config, mix, sizes (docs/reasoning-gym.md).",
    )
    seed: int = Field(1234, description="Seed of the built-in task generator and shuffling.")
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig,
        description="Online difficulty filtering from the rollouts' pass rates; off by default.",
    )

    heldout_size: int | None = Field(
        None,
        ge=1,
        description="Rows carved (seeded by data.seed) out of a source without splits for "
        "held-out accuracy and never trained on, when eval_source is unset; None: "
        "eval.num_problems.",
    )

    _paths_exist = field_validator("source", "eval_source")(check_exists)
    _template = field_validator("prompt_template")(check_template)
    _template_kwargs = field_validator("chat_template_kwargs")(check_template_kwargs)

    @model_validator(mode="after")
    def _reasoning_gym_tasks(self) -> DataConfig:
        # Task names and config keys are checked now, not when the run has loaded its model.
        for source in dict.fromkeys((self.source, self.eval_source)):
            task = None if source is None else task_of(source)
            if task is not None:
                task_specs(task, self.reasoning_gym)
        return self

    @model_validator(mode="after")
    def _raw_text_has_no_turns(self) -> DataConfig:
        # Raw text has no turns to put a system prompt in, nor a template to read variables:
        # refused rather than accepted and ignored.
        if self.chat_template == "none" and self.system_prompt is not None:
            raise ValueError("system_prompt needs a chat template; chat_template is none")
        if self.chat_template == "none" and self.chat_template_kwargs:
            raise ValueError("chat_template_kwargs need a chat template; chat_template is none")
        return self
