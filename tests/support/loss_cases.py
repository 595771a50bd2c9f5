"""Cases the loss tests share: every loss with the aggregations it takes, test clip ranges,
and float64 tool trajectories (model turns between tool results, garbage where the mask is 0).
A helper, not a test module."""

from __future__ import annotations

import itertools

import torch

Tensor = torch.Tensor
AGGS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"]
ALGOS = [
    "gspo", "gspo_token", "grpo", "luspo", "sapo", "gmpo", "cispo", "dppo_tv", "dppo_kl", "vespo",
]  # fmt: skip
# DPPO's deltas are small here, so that the trust region drops some of these tokens
CLIPS = {
    "gspo": (0.03, 0.04), "gspo_token": (0.03, 0.04), "grpo": (0.2, 0.27), "luspo": (0.01, 0.012),
    "sapo": (0.2, 0.2), "gmpo": (0.3, 0.3), "cispo": (0.2, 0.28), "dppo_tv": (0.01, 0.012),
    "dppo_kl": (2e-4, 3e-4), "vespo": (0.2, 0.2),
}  # fmt: skip
ONLY = {"luspo": AGGS[0], "vespo": "token_mean"}  # the one aggregation each of these takes
CASES = [(a, g) for a, g in itertools.product(ALGOS, AGGS) if ONLY.get(a, g) == g]


def tool_batch(seed: int, b: int = 4, t: int = 24) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """float64 [B, T] log-probs (grad), old log-probs, per-token advantages and a model-token
    mask: a prompt prefix, then model turns separated by tool results (mask 0), then padding.
    Tool and padding positions hold garbage that must not matter."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.05
    mask = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        col = int(torch.randint(0, 3, (1,), generator=g))  # prompt
        for _turn in range(int(torch.randint(1, 4, (1,), generator=g))):
            length = int(torch.randint(1, 5, (1,), generator=g))
            mask[i, col : min(t, col + length)] = 1
            col += length + int(torch.randint(1, 4, (1,), generator=g))  # a tool result after
            if col >= t - 1:
                break
    garbage = torch.full_like(lp, 30.0)
    lp = torch.where(mask > 0, lp, garbage).requires_grad_(True)
    old = torch.where(mask > 0, old, -garbage)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    return lp, old, adv, mask


def sequence_advantages(adv: Tensor, mask: Tensor, algo: str) -> Tensor:
    """GSPO-style losses take one advantage per response: give every token the row's."""
    if algo in ("sapo", "cispo", "gspo_token", "grpo", "dppo_tv", "dppo_kl", "vespo"):
        return adv
    row = (adv * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    return row.expand_as(adv).contiguous()
