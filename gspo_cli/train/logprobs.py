"""Per-token log-probs (and entropy) of response tokens under a causal LM."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from gspo_cli.train.batch import TrainBatch


def response_logprobs(
    model: PreTrainedModel, batch: TrainBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(y_t | x, y_<t) `[n, T]` at the sampling temperature, and the entropy `[n, T]`.

    The entropy is computed without grad (a metric). Logits of the prompt are never
    materialised beyond the last prompt position.
    """
    outputs = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=batch.response_mask.shape[1] + 1,
    )
    t = batch.response_mask.shape[1]
    logits = outputs.logits[:, -t - 1 : -1].float()  # [n, T, V]: position j predicts token j+1
    if temperature > 0:
        logits = logits / temperature
    targets = batch.input_ids[:, -t:]  # [n, T]
    log_probs = torch.log_softmax(logits, dim=-1)  # [n, T, V]
    token_logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n, T]
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1)  # [n, T]
    return token_logprobs, entropy
