"""Learning-rate schedule: linear warm-up, then constant, linear or cosine decay."""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_lambda(
    schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> Callable[[int], float]:
    """A multiplier of the peak lr for optimiser step `step` (0-based), for LambdaLR."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        decay = 1.0 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * decay

    return factor
