"""Per-token log-probs (and, where a metric or the entropy bonus reads it, entropy) of response
tokens."""

from __future__ import annotations

from typing import Literal

import torch
from transformers import PreTrainedModel

from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import ModelCapabilities, capabilities_of
from gspo_cli.models.forward.lm_head import at_least_float32, head_logprobs

ENTROPY_CHUNK_ROWS = 8  # rows per no-grad entropy pass: bounds its [rows, T, V] temporaries

# What `entropy` asks for: False none, True the metric (no grad needed), "grad" the entropy with
# its gradient (the entropy bonus, `algorithm.entropy_coef`).
EntropyMode = bool | Literal["grad"]


def response_logprobs(
    model: PreTrainedModel,
    batch: TrainBatch,
    temperature: float,
    entropy: EntropyMode = False,
    capabilities: ModelCapabilities | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(y_t | x, y_<t) `[n, T]` at the sampling temperature, and the entropy `[n, T]`
    when asked, else None.

    `capabilities`: the model's, as its engine decided them (None: the model's own, without
    prompt sharing). A plain linear LM head (most causal LMs) is applied by
    `lm_head.head_logprobs`: response tokens only, one `[tokens, V]` tensor in all; where the
    capabilities allow, each distinct prompt runs once (dense models, shared_prompts.py). Its
    entropy always carries a gradient (paid for in the backward only when used). Other models
    give their own logits, never beyond the last prompt position; the log-probs are the chosen
    logit minus the logsumexp, and the entropy is a metric computed without grad in chunks of
    rows, or, for "grad", on the whole `[n, T, V]` with grad.
    """
    caps = capabilities or capabilities_of(model)
    if caps.plain_head:
        share = caps.shares_prompts_at(batch.input_ids.shape[1])
        head = model.get_output_embeddings()
        return head_logprobs(model, head, batch, temperature, bool(entropy), share)
    outputs = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=batch.response_mask.shape[1] + 1,
    )
    t = batch.response_mask.shape[1]
    logits = at_least_float32(outputs.logits[:, -t - 1 : -1])  # [n, T, V]: j predicts token j+1
    if batch.temperature is not None:  # rows of their own temperature
        per_row = torch.where(batch.temperature > 0, batch.temperature, 1.0)  # [n]
        logits = logits / per_row.to(logits.dtype)[:, None, None]
    elif temperature > 0 and temperature != 1.0:  # (a division by 1 would copy [n, T, V])
        logits = logits / temperature
    targets = batch.input_ids[:, -t:]  # [n, T]
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n, T]
    token_logprobs = chosen - torch.logsumexp(logits, dim=-1)  # [n, T]
    if not entropy:
        return token_logprobs, None
    if entropy == "grad":
        log_p = torch.log_softmax(logits, dim=-1)  # [n, T, V]
        return token_logprobs, -(log_p.exp() * log_p).sum(dim=-1)  # [n, T]
    with torch.no_grad():
        parts = []
        for rows in logits.detach().split(ENTROPY_CHUNK_ROWS):  # each [r, T, V]
            log_p = torch.log_softmax(rows, dim=-1)
            parts.append(-(log_p.exp() * log_p).sum(dim=-1))  # [r, T]
    return token_logprobs, torch.cat(parts)
