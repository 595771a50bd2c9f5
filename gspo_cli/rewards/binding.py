"""Bind a recipe's reward entry to a function: by registered name or dotted import path.

A reward function's signature says everything the trainer needs to know:

    def my_reward(completions, answer, *, scale: float = 1.0) -> list[float]: ...

- `completions` takes the completions: the parameter of that name, else the first one (any
  name but `prompts` or `completion_ids`);
- the other parameters name what else it reads, as lists aligned with the completions: dataset
  columns (`answer`, `tests`...), `prompts` (each completion's `prompt` column) and
  `completion_ids` (its token ids), TRL's names;
- `**kwargs` (TRL style, `fn(completions, **kwargs)`) receives `prompts`, `completion_ids` and
  every other dataset column as well, by keyword;
- keyword-only parameters are options, set from the recipe's `options` and checked against
  their annotations when the recipe loads (a misspelt option is an error with a suggestion;
  `**kwargs` never takes an option);
- keyword-only parameters named after a `RewardServices` field (`math_pool`, `judge_pool`,
  `reward_context`) are shared workers the trainer hands in; a recipe cannot set them.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gspo_cli.core.import_probe import probe_import
from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.contract import declares_structured_answers
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rewards.registry import REWARDS, RewardFn
from gspo_cli.sandbox.pool import SandboxPool


@dataclass(frozen=True)
class RewardServices:
    """Shared workers, created and closed by whoever runs the rewards (trainer, eval)."""

    math_pool: MathVerifierPool | None = None
    judge_pool: SandboxPool | None = None
    reward_context: RewardContext | None = None  # model-backed rewards: cache, device, counts


SERVICE_NAMES = frozenset(f.name for f in fields(RewardServices))


# TRL's names for what a reward reads besides dataset columns; `prompts` is the `prompt` column.
COMPLETIONS, PROMPTS, COMPLETION_IDS, PROMPT_COLUMN = (
    "completions",
    "prompts",
    "completion_ids",
    "prompt",
)
BATCH_INPUTS = (COMPLETIONS, PROMPTS, COMPLETION_IDS)
ANSWER_COLUMN = "answer"  # data.answer_column, renamed


@dataclass(frozen=True)
class RewardSignature:
    completions: str  # the parameter that takes the completions
    inputs: tuple[str, ...]  # the other parameters fed from the batch, in call order
    positional: tuple[str, ...]  # the positional-only ones (completions too), in order
    options: Mapping[str, inspect.Parameter]  # keyword-only tunables
    services: tuple[str, ...]  # keyword-only shared workers
    var_keyword: bool  # **kwargs: TRL style, every other column by keyword

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns it names (not prompts / completion_ids)."""
        return tuple(name for name in self.inputs if name not in BATCH_INPUTS)


def resolve_reward(name: str) -> RewardFn:
    """A registered reward (`math`, `code`) or a user function `package.module:function`
    (or `package.module.function`), imported with the working folder on the import path (as
    `python -m` has it). Raises ValueError naming the problem."""
    if name in REWARDS:
        return REWARDS.get(name)
    if "." not in name and ":" not in name:
        known = ", ".join(REWARDS.names())
        raise ValueError(f"unknown reward {name!r}; known: {known}, or module:function")
    module_name, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
    folder = os.getcwd()
    if folder not in sys.path:  # the console script's path starts at its own bin folder
        sys.path.append(folder)  # after the installed packages: it shadows none of them
    probe_import(name, module_name)  # in a child first: an exit or a hang there is one line
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = ""
        if exc.name is not None and f"{module_name}.".startswith(f"{exc.name}."):
            hint = f"; looked in the working folder {folder} and on PYTHONPATH"
        raise ValueError(f"reward {name!r}: cannot import {module_name!r} ({exc}){hint}") from None
    except Exception as exc:  # any import failure of user code means "cannot use this reward"
        raise ValueError(f"reward {name!r}: cannot import {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {name!r}: {module_name!r} has no function {attr!r}")
    return typing.cast(RewardFn, fn)


def reward_signature(name: str, fn: Callable[..., Any]) -> RewardSignature:
    params = list(inspect.signature(fn).parameters.values())
    inputs, options, services, var_keyword = [], {}, [], False
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            raise ValueError(
                f"reward {name!r}: *{p.name} has no meaning for a reward; name the columns it reads"
            )
        if p.kind == p.VAR_KEYWORD:
            var_keyword = True
        elif p.kind == p.KEYWORD_ONLY and p.name not in BATCH_INPUTS:
            if p.name in SERVICE_NAMES:
                services.append(p.name)
            else:
                options[p.name] = p
        else:
            inputs.append(p)
    completions = _completions_parameter(name, inputs)
    return RewardSignature(
        completions,
        tuple(p.name for p in inputs if p.name != completions),
        tuple(p.name for p in inputs if p.kind == p.POSITIONAL_ONLY),
        options,
        tuple(services),
        var_keyword,
    )


def _completions_parameter(name: str, inputs: list[inspect.Parameter]) -> str:
    """`completions` when a parameter has that name, else the first (positional) one, which
    must not be one of TRL's other names: `fn(prompts, completions)` takes both by name."""
    names = [p.name for p in inputs]
    if COMPLETIONS in names:
        return COMPLETIONS
    first = inputs[0] if inputs else None
    if first is None or first.name in BATCH_INPUTS:
        taken = f" ({first.name!r} is not the completions)" if first is not None else ""
        raise ValueError(
            f"reward {name!r}: no parameter takes the completions{taken}; "
            "name it `completions` (TRL style) or make it the first"
        )
    return first.name


def text_answer_readers(names: Sequence[str]) -> list[str]:
    """The rewards of `names` that read the `answer` column (by name, or by `**kwargs`) and do
    not declare that they take answers other than text."""
    readers = []
    for name in names:
        fn = resolve_reward(name)
        signature = reward_signature(name, fn)
        reads = ANSWER_COLUMN in signature.columns or signature.var_keyword
        if reads and not declares_structured_answers(fn):
            readers.append(name)
    return readers


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
    """A reward function with its options and services bound; `arguments` gives its inputs."""

    name: str
    fn: Callable[..., Any]
    signature: RewardSignature
    builtin: bool  # registered (math, code): bounds its own time, runs in the trainer

    @property
    def columns(self) -> tuple[str, ...]:
        return self.signature.columns

    def __call__(self, completions: list[str], rows: Sequence[Mapping[str, Any]]) -> Any:
        """A plain call in this process, unchecked (`WeightedRewards` checks and bounds calls)."""
        args, kwargs = self.arguments(completions, rows)
        return self.fn(*args, **kwargs)

    def arguments(
        self,
        completions: list[str],
        rows: Sequence[Mapping[str, Any]],
        completion_ids: list[list[int]] | None = None,
    ) -> tuple[list[Any], dict[str, Any]]:
        """(args, kwargs) of the call on these completions (one row each); ValueError for an
        input the batch does not have."""
        sig = self.signature
        missing = [c for c in sig.columns if any(c not in row for row in rows)]
        if PROMPTS in sig.inputs and any(PROMPT_COLUMN not in row for row in rows):
            missing.append(f"{PROMPT_COLUMN} (for {PROMPTS})")
        if missing:
            have = ", ".join(rows[0]) if rows else "none"
            raise ValueError(
                f"reward {self.name!r} reads column(s) {', '.join(missing)}, which the data "
                f"does not have (columns: {have})"
            )
        if COMPLETION_IDS in sig.inputs and completion_ids is None:
            raise ValueError(f"reward {self.name!r} reads {COMPLETION_IDS}, which this run lacks")
        values = {**self._batch_values(rows, completion_ids), sig.completions: completions}
        args = [values[n] for n in sig.positional]
        kwargs = {n: values[n] for n in (sig.completions, *sig.inputs) if n not in sig.positional}
        if sig.var_keyword:  # TRL style: everything else it may read, by keyword
            # an option's name is never a column's; `prompt` came as `prompts`, as in TRL
            taken = {sig.completions, *sig.inputs, *sig.options, *sig.services, PROMPT_COLUMN}
            kwargs.update({k: v for k, v in values.items() if k not in taken})
        return args, kwargs

    def _batch_values(
        self, rows: Sequence[Mapping[str, Any]], completion_ids: list[list[int]] | None
    ) -> dict[str, Any]:
        """The inputs a call may read: columns (TRL's names reserved), `prompts` (the `prompt`
        column), `completion_ids`: those it names, or all of them for `**kwargs`."""
        wanted, every = set(self.signature.inputs), self.signature.var_keyword
        columns = [
            k for k in dict.fromkeys(k for row in rows for k in row) if k not in BATCH_INPUTS
        ]
        values: dict[str, Any] = {
            k: [row.get(k) for row in rows] for k in columns if every or k in wanted
        }
        if PROMPT_COLUMN in columns and (every or PROMPTS in wanted):
            values[PROMPTS] = [row.get(PROMPT_COLUMN) for row in rows]
        if completion_ids is not None:
            values[COMPLETION_IDS] = completion_ids
        return values


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
    return BoundReward(name, partial(fn, **bound), signature, name in REWARDS)


def _required(fn: Callable[..., Any], parameter: str) -> bool:
    return inspect.signature(fn).parameters[parameter].default is inspect.Parameter.empty
