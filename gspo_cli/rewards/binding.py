"""Bind a recipe's reward entry to a function: by registered name or dotted import path.

A reward function's signature says everything the trainer needs to know:

    def my_reward(completions, answer, *, scale: float = 1.0) -> list[float]: ...

- `completions` first; then the dataset columns it reads (positional: `answer`, `tests`...),
  which the trainer passes as lists aligned with the completions;
- keyword-only parameters are options, set from the recipe's `options` and checked against
  their annotations when the recipe loads (a misspelt option is an error with a suggestion);
- keyword-only parameters named after a `RewardServices` field (`math_pool`, `judge_pool`) are
  shared workers the trainer hands in; a recipe cannot set them.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gspo_cli.rewards.code.judge import JudgePool
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rewards.registry import REWARDS, RewardFn


@dataclass(frozen=True)
class RewardServices:
    """Shared workers, created and closed by whoever runs the rewards (trainer, eval)."""

    math_pool: MathVerifierPool | None = None
    judge_pool: JudgePool | None = None


SERVICE_NAMES = frozenset(f.name for f in fields(RewardServices))


@dataclass(frozen=True)
class RewardSignature:
    columns: tuple[str, ...]  # dataset columns, in call order after `completions`
    options: Mapping[str, inspect.Parameter]  # keyword-only tunables
    services: tuple[str, ...]  # keyword-only shared workers


def resolve_reward(name: str) -> RewardFn:
    """A registered reward (`math`, `code`) or a user function `package.module:function`
    (or `package.module.function`). Raises ValueError naming the problem."""
    if name in REWARDS:
        return REWARDS.get(name)
    if "." not in name and ":" not in name:
        known = ", ".join(REWARDS.names())
        raise ValueError(f"unknown reward {name!r}; known: {known}, or module:function")
    module_name, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure of user code means "cannot use this reward"
        raise ValueError(f"reward {name!r}: cannot import {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {name!r}: {module_name!r} has no function {attr!r}")
    return typing.cast(RewardFn, fn)


def reward_signature(name: str, fn: Callable[..., Any]) -> RewardSignature:
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        raise ValueError(f"reward {name!r}: the first parameter must take the completions")
    columns, options, services = [], {}, []
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(
                f"reward {name!r}: *{p.name} / **{p.name} would accept knobs and ignore them; "
                "name the columns and options it uses"
            )
        if p.kind == p.KEYWORD_ONLY:
            if p.name in SERVICE_NAMES:
                services.append(p.name)
            else:
                options[p.name] = p
        else:
            columns.append(p.name)
    return RewardSignature(tuple(columns), options, tuple(services))


def check_options(name: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The options, validated against `fn`'s keyword-only parameters and their annotations."""
    signature = reward_signature(name, fn)
    hints = typing.get_type_hints(fn)
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key not in signature.options:
            close = difflib.get_close_matches(key, list(signature.options), n=1, cutoff=0.5)
            known = ", ".join(signature.options) or "none"
            hint = f"did you mean {close[0]!r}?" if close else f"its options: {known}"
            raise ValueError(f"reward {name!r} has no option {key!r}; {hint}")
        if key in hints:
            try:
                value = TypeAdapter(hints[key]).validate_python(value)
            except ValidationError as exc:
                msg = exc.errors()[0]["msg"]
                raise ValueError(f"reward {name!r} option {key!r}: {msg} (got {value!r})") from None
        checked[key] = value
    missing = [k for k, p in signature.options.items() if p.default is p.empty and k not in options]
    if missing:
        raise ValueError(f"reward {name!r} needs option(s) {', '.join(missing)}")
    return checked


@dataclass(frozen=True)
class BoundReward:
    """A reward function with its options and services bound; call with completions + rows."""

    name: str
    fn: Callable[..., list[float]]
    columns: tuple[str, ...]

    def __call__(self, completions: list[str], rows: list[Mapping[str, Any]]) -> list[float]:
        missing = [c for c in self.columns if rows and c not in rows[0]]
        if missing:
            have = ", ".join(rows[0]) if rows else "none"
            raise ValueError(
                f"reward {self.name!r} reads column(s) {', '.join(missing)}, which the data "
                f"does not have (columns: {have})"
            )
        columns = [[row[c] for row in rows] for c in self.columns]
        return self.fn(completions, *columns)


def bind_reward(name: str, options: Mapping[str, Any], services: RewardServices) -> BoundReward:
    fn = resolve_reward(name)
    signature = reward_signature(name, fn)
    bound = check_options(name, fn, options)
    for service in signature.services:
        worker = getattr(services, service)
        if worker is not None:
            bound[service] = worker
        elif _required(fn, service):
            raise ValueError(f"reward {name!r} needs {service}, which this run does not provide")
    return BoundReward(name, partial(fn, **bound), signature.columns)


def _required(fn: Callable[..., Any], parameter: str) -> bool:
    return inspect.signature(fn).parameters[parameter].default is inspect.Parameter.empty
