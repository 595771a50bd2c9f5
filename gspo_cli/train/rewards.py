"""Score completions with the recipe's weighted reward functions."""

from __future__ import annotations

from typing import Any

from gspo_cli.errors import GspoError
from gspo_cli.recipe.schema import RewardConfig
from gspo_cli.rewards.binding import BoundReward, RewardServices, bind_reward
from gspo_cli.rewards.code.isolation import allow_weak_isolation, checked_mode


class RewardModel:
    """Sum of weighted reward functions; `accuracy` is the first function's share of 1.0 scores.

    Options were checked against each function's signature when the recipe loaded; here they
    are bound, with the shared workers (`services`) the caller owns and closes.
    """

    def __init__(self, cfg: RewardConfig, services: RewardServices) -> None:
        allow_weak_isolation(cfg.sandbox.allow_weak_isolation)
        if any(f.name == "code" for f in cfg.functions):
            checked_mode()  # no usable sandbox: one line now, not after the model has loaded
        try:
            self.functions: list[tuple[BoundReward, float]] = [
                (bind_reward(f.name, f.options, services), f.weight) for f in cfg.functions
            ]
        except ValueError as exc:
            raise GspoError(f"reward: {exc}") from None

    def __call__(
        self, completions: list[str], rows: list[dict[str, Any]]
    ) -> tuple[list[float], list[float]]:
        """(total rewards, per-completion correctness of the first function) for N rows."""
        totals = [0.0] * len(completions)
        correct: list[float] = []
        for i, (reward, weight) in enumerate(self.functions):
            try:
                scores = reward(completions, rows)
            except ValueError as exc:
                raise GspoError(f"reward: {exc}") from None
            totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
            if i == 0:
                correct = [1.0 if s >= 1.0 else 0.0 for s in scores]
        return totals, correct
