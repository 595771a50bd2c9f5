"""Each distinct prompt of a micro-batch runs through the backbone once, not once per response.

A group's G responses share one prompt, and on reasoning tasks the prompt is often most of a
row (the quickstart: 65 prompt tokens, about 17 response tokens). Computing its keys and values
G times is work that cannot change the update: here the distinct prompts run once, their
keys/values are gathered to every row that has them (an index_select, through which autograd
sums the rows' gradients back onto the one prompt forward), and the responses run on top as a
second forward. Same gradient as the padded batch up to float rounding; fewer tokens computed.

Only for dense, full-attention models with a plain LM head (the caller checks the head): a
MoE router would see the prompt tokens once instead of G times (its aux loss and routing
replay count tokens), and gradient checkpointing turns the cache off.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from gspo_cli.distinct import distinct_rows
from gspo_cli.train.batch import TrainBatch

# Dense architectures whose backbone takes a DynamicCache and returns it filled (a test runs
# each one's shared forward against the padded one).
SHARED_PROMPT_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention"})
# Rotary embeddings whose frequencies do not depend on the call: "dynamic" and "longrope"
# rescale them from the longest position a forward sees, which the prompt pass alone is not.
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def can_share_prompts(model: PreTrainedModel, length: int) -> bool:
    """Whether rows of `length` tokens can take their prompt's keys/values from a cache: a
    listed dense type with static rotary frequencies and no dropout (a group's rows would share
    one mask on their prompt), no gradient checkpointing, no attention window shorter than a
    row."""
    config = model.config
    if getattr(config, "model_type", None) not in SHARED_PROMPT_MODEL_TYPES:
        return False
    if getattr(model, "is_gradient_checkpointing", False):
        return False
    if getattr(config, "attention_dropout", 0.0) and model.training:
        return False
    if not _rope_types(config) <= STATIC_ROPE_TYPES:
        return False
    if not set(getattr(config, "layer_types", None) or ["full_attention"]) <= ATTENTION_KINDS:
        return False
    window = getattr(config, "sliding_window", None)
    return not window or length <= window


def _rope_types(config: object) -> set[str]:
    """The rotary types of the config: one, or one per layer type."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return {"default"}
    if all(isinstance(v, dict) for v in params.values()):  # {layer type: parameters}
        return {str(v.get("rope_type", v.get("type", "default"))) for v in params.values()}
    return {str(params.get("rope_type", params.get("type", "default")))}


def distinct_prompts(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(`[u]` one row of each distinct prompt, `[n]` each row's prompt among those u)."""
    p = batch.prompt_width
    return distinct_rows(torch.cat([batch.input_ids[:, :p], batch.attention_mask[:, :p]], dim=1))


def response_hidden(model: PreTrainedModel, batch: TrainBatch, share: bool) -> torch.Tensor:
    """`[n, T, H]`: the backbone's last hidden state at every position that predicts a
    response token (the last prompt position, then the response's own but its last)."""
    t = batch.response_mask.shape[1]
    if share and can_share_prompts(model, batch.input_ids.shape[1]):
        first, inverse = distinct_prompts(batch)
        if len(first) < len(inverse):
            return _on_shared_prompts(model, batch, first, inverse)
    hidden = model.base_model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state  # [n, P + T, H]
    return hidden[:, -t - 1 : -1]


def _on_shared_prompts(
    model: PreTrainedModel, batch: TrainBatch, first: torch.Tensor, inverse: torch.Tensor
) -> torch.Tensor:
    p = batch.prompt_width
    prompts = model.base_model(
        input_ids=batch.input_ids[first, :p],  # [u, P], left-padded
        attention_mask=batch.attention_mask[first, :p],
        position_ids=batch.position_ids[first, :p],
        use_cache=True,
    )
    cache = prompts.past_key_values
    cache.reorder_cache(inverse)  # [u, ...] -> [n, ...]: every row gets its prompt's keys/values
    responses = model.base_model(
        input_ids=batch.input_ids[:, p:],  # [n, T], right-padded
        attention_mask=batch.attention_mask,  # [n, P + T]: the cached prompt, then the response
        position_ids=batch.position_ids[:, p:],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state  # [n, T, H]
    last_prompt = prompts.last_hidden_state[inverse, -1:]  # [n, 1, H]: predicts the first token
    return torch.cat([last_prompt, responses[:, :-1]], dim=1)
