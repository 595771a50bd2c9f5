"""Reward functions by name. Signature: fn(completions, <dataset columns>, *, <options>).

What each parameter means (columns, options, shared workers) is read from the function's
signature by `rewards.binding`: options are keyword-only parameters, so a misspelt knob is an
error, and a TRL-style `**kwargs` takes data columns only. What a call must return is checked by
`rewards.contract`.
"""

from __future__ import annotations

from collections.abc import Callable

from gspo_cli.core.registry import Registry

RewardFn = Callable[..., list[float]]

REWARDS: Registry[RewardFn] = Registry("reward function")
