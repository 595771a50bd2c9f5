"""Seeded sampling in ONE batched `generate`: every row draws its own noise.

Sampling y ~ softmax(z) equals taking argmax(z + g) with g i.i.d. Gumbel(0, 1) noise (the
Gumbel-max trick). With one `torch.Generator` per row, row r's t-th token depends only on its
own seed and its own logits, never on its batch neighbours or on how rows are chunked or spread
over ranks: runs stay independent of the number of processes at batched speed.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from transformers import LogitsProcessor


def row_seeds(prompt_seeds: list[int], samples: int) -> list[int]:
    """One seed per response, prompt by prompt: `samples` seeds mixed from each prompt seed."""
    return [
        int(np.random.SeedSequence([seed, j]).generate_state(1, dtype=np.uint64)[0] >> 1)
        for seed in prompt_seeds
        for j in range(samples)
    ]


class GumbelMaxSampling(LogitsProcessor):
    """Last in the processor list of a greedy `generate`: adds each row's own Gumbel noise to
    the warped scores (temperature, top-k, top-p already applied), so argmax samples them."""

    def __init__(self, seeds: list[int], device: torch.device) -> None:
        # CPU generators: the same noise on every device type, and per-row draws stay cheap.
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.device = device

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        n, vocab = scores.shape
        if n != len(self.generators):
            raise ValueError(f"{n} rows but {len(self.generators)} seeds")
        uniform = torch.stack([torch.rand(vocab, generator=g) for g in self.generators])  # [n, V]
        tiny = torch.finfo(uniform.dtype).tiny
        gumbel = -torch.log(-torch.log(uniform.clamp(min=tiny)))  # [n, V]
        noisy = scores + gumbel.to(self.device, scores.dtype)  # -inf (filtered) stays -inf
        return cast(torch.FloatTensor, noisy)
