"""A decoding loop that drops finished rows: a step costs what the unfinished rows cost.

`generate` keeps computing every row until the longest one ends. RL batches are uneven (most
responses far under the cap, a few at it), so most of its late steps are spent on rows that
are already done. Here a row leaves the batch, and its KV cache, at its end-of-turn token; the
tokens come out as `generate` would give them (the same processors, a greedy pick after them,
padding after end-of-turn). Sampling is the processors' job (rollout/seeded.py).
A group's samples share their prompt: each distinct prompt is prefilled once and its cache
entries copied to its rows.

Processors see only the rows still decoding. One that keeps per-row state implements
`RowAware.step_done`, which is told each step's picks and which rows go on; stateless ones
(temperature, top-k, top-p) need nothing.
"""

from __future__ import annotations

from typing import Protocol, cast, runtime_checkable

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel

from gspo_cli.models.forward.distinct import distinct_rows


@runtime_checkable
class RowAware(Protocol):
    def step_done(self, chosen: torch.Tensor, going: torch.Tensor) -> None:
        """`chosen` `[a]`: the tokens just picked for the current rows; `going` `[k]`: the
        indices (into the current rows) of those that stay; the others leave the batch."""


@torch.no_grad()
def decode_dropping_finished(
    model: PreTrainedModel,
    input_ids: torch.Tensor,  # [n, P], left-padded prompts
    attention_mask: torch.Tensor,  # [n, P]
    processors: LogitsProcessorList,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
) -> torch.Tensor:
    """`[n, P + T]` prompts and picked tokens, T the longest response, pad after end-of-turn."""
    n = input_ids.shape[0]
    new = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=input_ids.device)
    rows = torch.arange(n, device=input_ids.device)  # original index of each current row
    sequences = input_ids  # [a, P + t]: what the processors see
    mask = attention_mask  # [a, P + t]
    # [a, P]: left padding skipped (its own positions are masked out, whatever they are)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    logits = _prefill_distinct_prompts(model, input_ids, mask, positions, cache)  # [n, 1, V]
    steps = 0
    while True:
        # at least float32 (as generate), and a float64 model's own precision: its recorded
        # log-probs then equal the trainer's to float64 rounding
        scores = logits[:, -1].to(torch.promote_types(logits.dtype, torch.float32), copy=True)
        warped = processors(cast(torch.LongTensor, sequences), cast(torch.FloatTensor, scores))
        chosen = warped.argmax(dim=-1)  # [a]
        new[rows, steps] = chosen
        steps += 1
        going = (chosen != eos_id).nonzero()[:, 0]  # [k]
        for processor in processors:
            if isinstance(processor, RowAware):
                processor.step_done(chosen, going)
        if len(going) == 0 or steps == max_new_tokens:
            break
        if len(going) < len(rows):  # finished rows leave the batch and the cache
            rows, chosen = rows[going], chosen[going]
            sequences, mask, positions = sequences[going], mask[going], positions[going]
            # every layer kind has it (attention, conv, recurrent)
            cache.reorder_cache(cast(torch.LongTensor, going))
        sequences = torch.cat([sequences, chosen[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        positions = positions[:, -1:] + 1  # [a, 1]
        logits = model(
            input_ids=chosen[:, None],  # [a, 1]
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits  # [a, 1, V]
    return torch.cat([input_ids, new[:, :steps]], dim=1)


def _prefill_distinct_prompts(
    model: PreTrainedModel,
    input_ids: torch.Tensor,  # [n, P]
    mask: torch.Tensor,  # [n, P]
    positions: torch.Tensor,  # [n, P]
    cache: DynamicCache,
) -> torch.Tensor:
    """`[n, 1, V]` the logits after each prompt, filling `cache` for all n rows: each distinct
    prompt runs once (a group's samples share it) and its cache entries are copied per row."""
    first, inverse = distinct_rows(torch.cat([input_ids, mask], dim=1))
    shared = len(first) < len(inverse)
    if not shared:  # every prompt differs: prefill them as they are, in their order
        first = inverse = torch.arange(len(inverse), device=input_ids.device)
    logits: torch.Tensor = model(
        input_ids=input_ids[first],
        attention_mask=mask[first],
        position_ids=positions[first],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits  # [u, 1, V]
    if shared:
        cache.reorder_cache(cast(torch.LongTensor, inverse))  # [u, ...] -> [n, ...]
    return logits[inverse]
