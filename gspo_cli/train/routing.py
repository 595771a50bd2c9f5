"""Expert-routing volatility of MoE models (GSPO paper, section on MoE training).

The share of a token's top-k experts that change after a gradient update, averaged over
response tokens and layers: the instability that Routing Replay works around under GRPO.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from gspo_cli.models import is_moe
from gspo_cli.train.batch import TrainBatch


@torch.no_grad()
def routed_experts(model: PreTrainedModel, batch: TrainBatch) -> torch.Tensor | None:
    """`[L, n_response_tokens, k]` the experts each response token is routed to, or None (dense)."""
    if not is_moe(model.config):
        return None
    device = next(model.parameters()).device
    outputs = model(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
        output_router_logits=True,
        use_cache=False,
    )
    k = int(model.config.num_experts_per_tok)
    t = batch.response_mask.shape[1]
    response = torch.zeros_like(batch.attention_mask, dtype=torch.bool)  # [n, P + T]
    response[:, -t:] = batch.response_mask.bool()
    per_layer = []
    for logits in outputs.router_logits:  # each [n * (P + T), E]
        top = logits.topk(k, dim=-1).indices.view(*batch.input_ids.shape, k)  # [n, P + T, k]
        per_layer.append(top[response.to(top.device)].cpu())  # [tokens, k]
    return torch.stack(per_layer)


def routing_volatility(before: torch.Tensor, after: torch.Tensor) -> float:
    """Mean share of each token's top-k experts that differ between two routings."""
    k = before.shape[-1]
    same = (before.unsqueeze(-1) == after.unsqueeze(-2)).any(dim=-1).sum(dim=-1)  # [L, tokens]
    return float(1.0 - same.float().mean() / k)
