"""Which fast paths a model's forward can take, decided once when an engine wraps the model.

Every fast path is exact only for some architectures. The lists of those architectures stand
here side by side, one per capability, and `capabilities_of` reads them once; the training
planner, the log-prob path, the HF rollout engine and routing replay read the answer
(`ModelCapabilities`), never the model's type. An engine whose forward is not the model's own
(DeepSpeed) declares its capabilities itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from gspo_cli.models.routing import is_moe

# CausalLM classes whose logits are exactly `lm_head(last_hidden_state)`: no soft-capping, no
# logit scale (a test reads each one's forward to check it). lm_head.py computes their response
# log-probs from the hidden states with a hand-written backward.
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmoe"}
)
# Dense architectures whose backbone takes a DynamicCache and returns it filled (a test runs
# each one's shared forward against the padded one): shared_prompts.py. Not MoE: a router would
# see the prompt tokens once instead of G times (its aux loss and routing replay count tokens).
SHARED_PROMPT_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention"})
# Rotary embeddings whose frequencies do not depend on the call: "dynamic" and "longrope"
# rescale them from the longest position a forward sees, which the prompt pass alone is not.
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


@dataclass(frozen=True)
class ModelCapabilities:
    """What one wrapped model's forward can do (see the module docstring)."""

    plain_head: bool  # logits = a bias-free linear head of the last hidden state (lm_head.py)
    shares_prompts: bool  # each distinct prompt of a batch runs once (needs plain_head)
    attention_window: int | None  # rows longer than this cannot share their prompt's cache
    drops_finished_rows: bool  # the HF decoding loop may drop finished rows (decode.py)
    records_routing: bool  # MoE: each token's experts can be recorded and replayed (routing.py)

    def shares_prompts_at(self, length: int) -> bool:
        """Whether rows of `length` tokens run each distinct prompt once."""
        return self.shares_prompts and (
            self.attention_window is None or length <= self.attention_window
        )


def capabilities_of(model: nn.Module, *, share_prompts: bool = False) -> ModelCapabilities:
    """The capabilities of `model` as it is now (train mode, gradient checkpointing on or off);
    `share_prompts`: whether the user allows prompt sharing (trainer.share_prompts)."""
    plain = plain_linear_head(model) is not None
    window = getattr(getattr(model, "config", None), "sliding_window", None)
    return ModelCapabilities(
        plain_head=plain,
        shares_prompts=share_prompts and plain and prompts_can_be_shared(model),
        attention_window=window or None,
        drops_finished_rows=can_drop_finished(model),
        records_routing=isinstance(model, PreTrainedModel) and is_moe(model.config),
    )


def plain_linear_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when its logits are a bias-free linear map of the backbone's last
    hidden state, else None (the model's own logits are used)."""
    if not isinstance(model, PreTrainedModel):
        return None  # a wrapper's forward may do more than the model's (DeepSpeed declares its own)
    model_type = getattr(model.config, "model_type", None)
    if model_type not in PLAIN_HEAD_MODEL_TYPES:
        return None
    if type(model).__name__ != MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]:
        return None  # e.g. remote code registered under a listed type
    head = model.get_output_embeddings()
    return head if type(head) is nn.Linear and head.bias is None else None


def prompts_can_be_shared(model: nn.Module) -> bool:
    """Whether rows can take their prompt's keys/values from a cache, at any length inside the
    attention window: a listed dense type with static rotary frequencies, no attention dropout
    while training (a group's rows would share one mask on their prompt), no gradient
    checkpointing (it turns the cache off)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SHARED_PROMPT_MODEL_TYPES:
        return False
    if getattr(model, "is_gradient_checkpointing", False):
        return False
    if getattr(config, "attention_dropout", 0.0) and model.training:
        return False
    if not _rope_types(config) <= STATIC_ROPE_TYPES:
        return False
    return set(getattr(config, "layer_types", None) or ["full_attention"]) <= ATTENTION_KINDS


def can_share_prompts(model: nn.Module, length: int) -> bool:
    """Whether rows of `length` tokens of `model` can share their prompts' forward."""
    return capabilities_of(model, share_prompts=True).shares_prompts_at(length)


def can_drop_finished(model: nn.Module) -> bool:
    """Whether the decoding loop's `DynamicCache` is this model's cache (not for xLSTM, RWKV,
    ...), as transformers' own `generate` decides it; unknown: no (`generate` runs instead)."""
    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    return bool(supports()) if callable(supports) else False


def _rope_types(config: object) -> set[str]:
    """The rotary types of the config: one, or one per layer type."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return {"default"}
    if all(isinstance(v, dict) for v in params.values()):  # {layer type: parameters}
        return {str(v.get("rope_type", v.get("type", "default"))) for v in params.values()}
    return {str(params.get("rope_type", params.get("type", "default")))}
