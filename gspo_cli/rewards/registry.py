"""Reward functions share one signature: fn(completions, **dataset_columns) -> list[float]."""

from __future__ import annotations

from typing import Any, Protocol

from gspo_cli.registry import Registry


class RewardFn(Protocol):
    def __call__(self, completions: list[str], **dataset_columns: Any) -> list[float]: ...


REWARDS: Registry[RewardFn] = Registry("reward function")
