"""Reward functions by name. Signature: fn(completions, *dataset_columns, **options).

What each parameter means (columns, options, shared workers) is read from the function's
signature by `rewards.binding`; there is no `**_` catch-all that would swallow a misspelt knob.
"""

from __future__ import annotations

from collections.abc import Callable

from gspo_cli.registry import Registry

RewardFn = Callable[..., list[float]]

REWARDS: Registry[RewardFn] = Registry("reward function")
