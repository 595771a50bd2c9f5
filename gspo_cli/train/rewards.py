"""Score completions with the recipe's weighted reward functions."""

from __future__ import annotations

from functools import partial
from typing import Any

from gspo_cli.errors import GspoError
from gspo_cli.recipe.schema import RewardConfig
from gspo_cli.rewards import REWARDS, RewardFn
from gspo_cli.rewards.math_verifier import default_math_pool


class RewardModel:
    """Sum of weighted reward functions; `accuracy` is the first function's share of 1.0 scores."""

    def __init__(self, cfg: RewardConfig) -> None:
        default_math_pool(cfg.num_workers, cfg.timeout_s)  # size the verifier pool from the recipe
        self.functions: list[tuple[str, RewardFn, float]] = [
            (f.name, partial(REWARDS.get(f.name), **f.options), f.weight) for f in cfg.functions
        ]

    def __call__(
        self, completions: list[str], rows: list[dict[str, Any]]
    ) -> tuple[list[float], list[float]]:
        """(total rewards, per-completion correctness of the first function) for N rows."""
        columns = {key: [row.get(key) for row in rows] for key in rows[0]} if rows else {}
        totals = [0.0] * len(completions)
        correct: list[float] = []
        for i, (name, fn, weight) in enumerate(self.functions):
            try:
                scores = fn(completions, **columns)
            except TypeError as exc:
                raise GspoError(f"reward {name!r} cannot score this data: {exc}") from None
            totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
            if i == 0:
                correct = [1.0 if s >= 1.0 else 0.0 for s in scores]
        return totals, correct
