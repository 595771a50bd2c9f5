"""Each distinct prompt of a micro-batch runs through the backbone once, not once per response.

A group's G responses share one prompt, and on reasoning tasks the prompt is often most of a
row (the quickstart: 65 prompt tokens, about 17 response tokens). Computing its keys and values
G times is work that cannot change the update: here the distinct prompts run once, their
keys/values are gathered to every row that has them (an index_select, through which autograd
sums the rows' gradients back onto the one prompt forward), and the responses run on top as a
second forward. Same gradient as the padded batch up to float rounding; fewer tokens computed.

Only where the model's capabilities allow it (capabilities.py: dense, full-attention models
with a plain LM head, no gradient checkpointing); the caller decides.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.distinct import distinct_rows


def distinct_prompts(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(`[u]` one row of each distinct prompt, `[n]` each row's prompt among those u)."""
    p = batch.prompt_width
    return distinct_rows(torch.cat([batch.input_ids[:, :p], batch.attention_mask[:, :p]], dim=1))


def response_hidden(model: PreTrainedModel, batch: TrainBatch, share: bool) -> torch.Tensor:
    """`[n, T, H]`: the backbone's last hidden state at every position that predicts a
    response token (the last prompt position, then the response's own but its last).
    `share`: the model's capabilities allow each distinct prompt to run once at this length."""
    t = batch.response_mask.shape[1]
    if share:
        # decided when the engine wrapped the model (capabilities.py); these two can change after
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
        dropout = getattr(model.config, "attention_dropout", 0.0) and model.training
        assert not checkpointing and not dropout, "prompt sharing decided before the model changed"
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
