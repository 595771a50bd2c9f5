"""Size bounds of a recipe, checked when it validates, before anything is loaded.

- The rollout batch (num_prompts x group_size) against MAX_ROLLOUT_BATCH.
- The longest prompt + response against the model's positions, when the model's config is known
  without loading it: the built-in models' table, a local folder's config.json, or the
  config.json of a hub id already in the local hub cache (the hub itself is never asked here).
- `rollout.max_staleness` against `trainer.steps`: a staleness the run never reaches would
  train every step on the initial policy's samples.
- A rough memory estimate (the KV cache of the responses generated at once, the activations
  and logits of one training micro-batch, and LoRA adapters with their gradients and AdamW
  states), compared with the available RAM of a CPU run: one warning line, or an error when the
  adapters alone push it over (a rank too large for the machine). The LoRA parts are checked by
  `check_lora_memory`, which train/engines/adapters.py calls once it knows the adapters' size.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES
from gspo_cli.recipe.schema import Recipe
from gspo_cli.recipe.section import looks_local
from gspo_cli.runs.folder import HF_CONFIG

log = logging.getLogger(__name__)

# Most responses per RL step (rollout.num_prompts x rollout.group_size). Each one is generated,
# scored and trained on every step; the paper's scale is 128 x 16 = 2,048. Past 65,536 a typo is
# likelier than a plan, and the run would only exhaust memory before its first step.
MAX_ROLLOUT_BATCH = 65_536

BUILTIN_PREFIX = "builtin:"  # as models.builtin, which is not imported here (it loads torch)
GIB = 1024**3
LOGIT_BYTES = 4  # the LM head's logits are float32 whatever the model's dtype
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# Values kept for backward per token, layer and hidden unit: Korthikanti et al. 2022 count
# 34 bytes x hidden in 16 bits (sbh(10 + 24)), leaving out the attention scores.
ACTIVATION_VALUES = 17
# Responses the hf engine generates at once (HFGenerateEngine's max_batch; a test pins it).
HF_GENERATE_ROWS = 256
# Bytes per LoRA adapter parameter while training: peft keeps adapters in float32, and each
# has a float32 gradient and AdamW's two float32 states (exp_avg, exp_avg_sq).
ADAPTER_PARAM_BYTES = 4 * 4


class ModelShape(NamedTuple):
    """The sizes of a model that bound a recipe; None where the config does not say."""

    positions: int | None  # max_position_embeddings
    layers: int | None
    hidden: int | None
    kv_heads: int | None
    head_dim: int | None
    vocab: int | None
    experts: int = 0  # routed experts per layer; 0 for a dense model


# The config names of the routed-expert count, as models.routing reads them from a loaded
# model (not imported here: it loads torch; a test keeps the two equal).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


# The built-in models' configs (gspo_cli/models/builtin.py and gguf.py), read here without
# building them; a test compares each entry with the model that is built or converted.
BUILTIN_SHAPES = {
    "tiny-dense": ModelShape(
        positions=8192, layers=4, hidden=128, kv_heads=2, head_dim=32, vocab=102
    ),
    "tiny-moe": ModelShape(
        positions=8192, layers=4, hidden=128, kv_heads=2, head_dim=32, vocab=102, experts=8
    ),
    "tiny-moe-deep": ModelShape(
        positions=8192, layers=8, hidden=128, kv_heads=2, head_dim=32, vocab=102, experts=16
    ),
    "smollm2-135m": ModelShape(  # SmolLM2-135M-Instruct (models/gguf.py)
        positions=8192, layers=30, hidden=576, kv_heads=3, head_dim=64, vocab=49152
    ),
}


def _size(config: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """The sizes of an HF config.json (Llama/Qwen names, GPT-2's n_* names, a multimodal
    model's text_config)."""
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, **text}
    heads = _size(config, "num_attention_heads", "n_head")
    hidden = _size(config, "hidden_size", "n_embd")
    head_dim = _size(config, "head_dim") or (hidden // heads if hidden and heads else None)
    experts = _size(config, *EXPERT_COUNT_KEYS) or 0
    return ModelShape(
        positions=_size(config, "max_position_embeddings", "n_positions"),
        layers=_size(config, "num_hidden_layers", "n_layer"),
        hidden=hidden,
        kv_heads=_size(config, "num_key_value_heads") or heads,
        head_dim=head_dim,
        vocab=_size(config, "vocab_size"),
        experts=experts if experts > 1 else 0,  # one expert is a dense block
    )


def model_config_file(path: str) -> Path | None:
    """The model's config.json when it is on disk: a local folder, or a cached hub id."""
    local = Path(path).expanduser()
    if looks_local(path) or local.is_dir():
        return local / HF_CONFIG if (local / HF_CONFIG).is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(path, HF_CONFIG)
    except ValueError:  # not a valid repo id: loading it reports that
        return None
    return Path(cached) if isinstance(cached, str) else None


def model_shape(path: str) -> ModelShape | None:
    """The model's shape, or None when it is not known without the hub (or not a model)."""
    if path.startswith(BUILTIN_PREFIX):
        return BUILTIN_SHAPES.get(path.removeprefix(BUILTIN_PREFIX))
    file = model_config_file(path)
    if file is None:
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {file}: {exc}") from None
    return shape_from_config(config) if isinstance(config, dict) else None


def batch_problem(recipe: Recipe) -> str | None:
    """The rollout batch over MAX_ROLLOUT_BATCH, named by its larger factor."""
    prompts, group = recipe.rollout.num_prompts, recipe.rollout.group_size
    if prompts * group <= MAX_ROLLOUT_BATCH:
        return None
    key = "rollout.group_size" if group >= prompts else "rollout.num_prompts"
    return (
        f"{key}: rollout.num_prompts x rollout.group_size = {prompts} x {group} = "
        f"{prompts * group} responses per step, over the cap of {MAX_ROLLOUT_BATCH:,} "
        "(MAX_ROLLOUT_BATCH in gspo_cli/recipe/bounds.py): every response is generated, scored "
        "and trained on each step, and a batch this size would exhaust memory first"
    )


def length_problems(recipe: Recipe, shape: ModelShape | None) -> list[str]:
    """Prompt + response lengths past the model's positions (training and held-out eval)."""
    if shape is None or shape.positions is None:
        return []
    prompt = recipe.data.max_prompt_tokens
    caps = [("rollout.max_new_tokens", recipe.rollout.max_new_tokens)]
    if recipe.eval.max_new_tokens is not None:
        caps.append(("eval.max_new_tokens", recipe.eval.max_new_tokens))
    return [
        f"{key}: data.max_prompt_tokens + {key} = {prompt} + {new} = {prompt + new} is past the "
        f"{shape.positions} positions of {recipe.model.path} (its max_position_embeddings): "
        "lower one of them"
        for key, new in caps
        if prompt + new > shape.positions
    ]


def expert_count_problem(experts: int, ep: int) -> str | None:
    """`deepspeed.expert_parallel` must split a model's routed experts evenly (the one rule:
    checked here at validate time for a known shape, by the engine for a loaded model)."""
    if ep <= 1:
        return None
    if experts <= 1:
        return f"deepspeed.expert_parallel ({ep}) needs a Mixture-of-Experts model"
    if experts % ep:
        return f"deepspeed.expert_parallel ({ep}) must divide the model's expert count ({experts})"
    return None


def expert_parallel_problem(recipe: Recipe, shape: ModelShape | None) -> str | None:
    """`expert_count_problem` for a model whose shape is known without loading it (a hub id's
    is checked when the engine starts)."""
    if shape is None:
        return None
    problem = expert_count_problem(shape.experts, recipe.deepspeed.expert_parallel)
    return None if problem is None else f"{problem}: {recipe.model.path}"


def staleness_problem(recipe: Recipe) -> str | None:
    """A max_staleness of at least trainer.steps: step s trains on a batch sampled by the
    policy of step max(0, s - 1 - max_staleness), so the run never reaches that staleness and
    every one of its steps trains on samples of the initial policy."""
    staleness, steps = recipe.rollout.max_staleness, recipe.trainer.steps
    if not staleness or staleness < steps:
        return None
    return (
        f"rollout.max_staleness: {staleness} is not below trainer.steps ({steps}): every step "
        f"would train on batches sampled by the initial policy (step s samples from the "
        f"policy of step s - 1 - {staleness}); lower max_staleness below {steps} (1 or 2 "
        "overlap sampling with training) or set it to 0"
    )


def size_problems(recipe: Recipe) -> list[str]:
    """Every size problem of a valid recipe, one line each (empty when none)."""
    problems = [p for p in [batch_problem(recipe), staleness_problem(recipe)] if p is not None]
    try:
        shape = model_shape(recipe.model.path)
    except ValueError as exc:
        return [*problems, f"model.path: {exc}"]
    ep = expert_parallel_problem(recipe, shape)
    return problems + length_problems(recipe, shape) + ([ep] if ep else [])


class MemoryEstimate(NamedTuple):
    kv_cache_bytes: int  # keys and values of the responses generated at once
    activation_bytes: int  # what one training micro-batch keeps for its backward
    logits_bytes: int  # float32 logits of that micro-batch's response tokens
    micro_rows: int
    micro_tokens: int  # rows x (prompt + response), or the token budget when smaller
    adapter_bytes: int = 0  # LoRA adapters, their gradients and AdamW states

    @property
    def total(self) -> int:
        return self.kv_cache_bytes + self.activation_bytes + self.logits_bytes + self.adapter_bytes


def estimate_memory(
    recipe: Recipe, shape: ModelShape, adapter_params: int = 0
) -> MemoryEstimate | None:
    """A rough upper estimate of the buffers that grow with the recipe's sizes, and of LoRA's
    `adapter_params` adapters with their gradients and AdamW states (not the model's own
    weights or a full fine-tune's optimizer states); None when the config lacks a size."""
    _, layers, hidden, kv_heads, head_dim, vocab, _ = shape
    if layers is None or hidden is None or kv_heads is None or head_dim is None or vocab is None:
        return None
    rollout, trainer, dtype = recipe.rollout, recipe.trainer, DTYPE_BYTES[recipe.model.dtype]
    rows = rollout.num_prompts * rollout.group_size
    row_tokens = recipe.data.max_prompt_tokens + rollout.max_new_tokens
    # vLLM sizes its own cache (rollout.vllm); the hf engine's grows with the rows it runs.
    in_trainer = ROLLOUT_ENGINES.get(rollout.engine).runs_in_trainer
    generated = min(rows, HF_GENERATE_ROWS) if in_trainer else 0
    kv_cache = generated * row_tokens * 2 * layers * kv_heads * head_dim * dtype  # K and V
    micro_rows = trainer.micro_batch_size or rows // recipe.algorithm.minibatches
    micro_tokens = micro_rows * row_tokens
    head_tokens = micro_rows * rollout.max_new_tokens  # only responses go through the LM head
    if trainer.max_tokens_per_micro_batch:
        micro_tokens = min(micro_tokens, trainer.max_tokens_per_micro_batch)
        head_tokens = min(head_tokens, trainer.max_tokens_per_micro_batch)
    if recipe.model.gradient_checkpointing:  # each layer's input, and one layer's full set
        kept = layers + ACTIVATION_VALUES
    else:
        kept = layers * ACTIVATION_VALUES
    return MemoryEstimate(
        kv_cache_bytes=kv_cache,
        activation_bytes=micro_tokens * kept * hidden * dtype,
        logits_bytes=head_tokens * vocab * LOGIT_BYTES,
        micro_rows=micro_rows,
        micro_tokens=micro_tokens,
        adapter_bytes=adapter_params * ADAPTER_PARAM_BYTES,
    )


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_warning(
    recipe: Recipe, shape: ModelShape | None, available: int, adapter_params: int = 0
) -> str | None:
    """One warning line when the estimate exceeds `available` bytes, else None."""
    estimate = estimate_memory(recipe, shape, adapter_params) if shape is not None else None
    if estimate is None or estimate.total <= available:
        return None
    adapters = (
        f", LoRA adapters with gradients and AdamW states ({estimate.adapter_bytes / GIB:.1f} GiB)"
        if estimate.adapter_bytes
        else ""
    )
    return (
        f"warning: {recipe.model.path}: about {estimate.total / GIB:.1f} GiB for one training "
        f"micro-batch of {estimate.micro_rows} rows ({estimate.micro_tokens} tokens: "
        f"{estimate.activation_bytes / GIB:.1f} GiB of activations, "
        f"{estimate.logits_bytes / GIB:.1f} GiB of logits){adapters} and the rollout's KV "
        f"cache ({estimate.kv_cache_bytes / GIB:.1f} GiB), more than the "
        f"{available / GIB:.1f} GiB of RAM available: lower trainer.micro_batch_size (0 = a "
        "whole minibatch), rollout.num_prompts, rollout.group_size or rollout.max_new_tokens"
    )


def lora_memory_problem(
    recipe: Recipe, shape: ModelShape | None, available: int, adapter_params: int
) -> str | None:
    """The line refusing model.lora.r when its adapters (weights, gradients, AdamW states)
    take the estimate past `available` bytes, which it stays within without them."""
    estimate = estimate_memory(recipe, shape, adapter_params) if shape is not None else None
    if estimate is None or estimate.total <= available:
        return None
    if estimate.total - estimate.adapter_bytes > available:
        return None  # too much without the adapters: memory_warning says what to lower
    return (
        f"model.lora.r: {recipe.model.lora.r} gives {adapter_params:,} adapter parameters, "
        f"{_amount(estimate.adapter_bytes)} with their gradients and AdamW states, which "
        f"takes the run's estimate to {estimate.total / GIB:.1f} GiB, more than the "
        f"{available / GIB:.1f} GiB of RAM available: lower model.lora.r or target fewer "
        "modules"
    )


def _amount(size: int) -> str:
    """Bytes in GiB, or in MiB below a tenth of a GiB (which would print as 0.0 GiB)."""
    return f"{size / GIB:.1f} GiB" if size >= GIB // 10 else f"{size / 1024**2:.1f} MiB"


def warn_memory(recipe: Recipe, adapter_params: int | None = None) -> None:
    """Log the memory warning of a CPU run, once per launch: on CUDA the GPU's memory is known
    only once the device is up, and a launcher's ranks load the recipe after their parent.
    A LoRA recipe is checked once its adapters' size is known (`check_lora_memory`)."""
    if recipe.model.lora.r and adapter_params is None:
        return
    available, shape = _cpu_memory_and_shape(recipe)
    line = None
    if available is not None:
        line = memory_warning(recipe, shape, available, adapter_params or 0)
    if line is not None:
        log.warning(line)


def check_lora_memory(recipe: Recipe, adapter_params: int) -> str | None:
    """For a LoRA recipe whose adapters have `adapter_params` parameters: the line refusing its
    rank (lora_memory_problem), else None after the memory warning, if any, is logged."""
    available, shape = _cpu_memory_and_shape(recipe)
    problem = None
    if available is not None:
        problem = lora_memory_problem(recipe, shape, available, adapter_params)
    if problem is None:
        warn_memory(recipe, adapter_params)
    return problem


def _cpu_memory_and_shape(recipe: Recipe) -> tuple[int | None, ModelShape | None]:
    """The RAM available to a CPU run that is no launcher's rank (None otherwise, or when
    unknown) and the model's shape (None when unknown; size_problems reports a bad config)."""
    if "LOCAL_RANK" in os.environ or not _trains_on_cpu(recipe):
        return None, None
    try:
        shape = model_shape(recipe.model.path)
    except ValueError:
        return None, None
    return available_memory_bytes(), shape


def _trains_on_cpu(recipe: Recipe) -> bool:
    if recipe.trainer.device != "auto":
        return recipe.trainer.device == "cpu"
    import torch  # loaded already: the schema's registries import it

    return not torch.cuda.is_available()
