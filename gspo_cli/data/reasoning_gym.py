"""reasoning-gym's procedural tasks as training rows: `data.source: reasoning_gym:TASK`, or
`reasoning_gym:composite` for several tasks mixed by weight (reasoning-gym's own composite
dataset). Each row carries its task name (`task`) and its reasoning-gym entry (`reasoning_gym`:
the task, its config, the question, the gold answer and the metadata its verifier reads), so
the `reasoning_gym` reward can score an answer with the task's own `score_answer`.

The held-out split is generated with another seed (`seed + HELDOUT_SEED_OFFSET`); its repeated
questions, and training questions it asks, are dropped, so the two never overlap.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

PREFIX = "reasoning_gym:"
COMPOSITE = "composite"  # reasoning-gym's name for a weighted mix of tasks
ENTRY_COLUMN = "reasoning_gym"  # the row's entry, what the reward's verifier reads
TASK_COLUMN = "task"  # the row's task name: per-task reward metrics group by it
# Far above composite's own seed offsets (sub-task i takes seed + i + 1), so no held-out task
# reuses a training task's seed.
HELDOUT_SEED_OFFSET = 1_000_003
SET_BY_RECIPE = ("seed", "size")  # keys data.reasoning_gym sets for every task


class TaskSettings(Protocol):
    """One task of a mix: its weight and its own config keys."""

    @property
    def weight(self) -> float: ...
    @property
    def config(self) -> Mapping[str, Any]: ...


class ReasoningGymSettings(Protocol):
    """What generating rows needs of `data.reasoning_gym` (read-only here)."""

    @property
    def config(self) -> Mapping[str, Any]: ...
    @property
    def tasks(self) -> Mapping[str, TaskSettings]: ...
    @property
    def size(self) -> int: ...
    @property
    def eval_size(self) -> int: ...
    @property
    def seed(self) -> int | None: ...


class TaskSpec(NamedTuple):
    name: str
    weight: float
    config: dict[str, Any]


class Splits(NamedTuple):
    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    note: str | None  # the line saying what was dropped to keep the splits apart


def task_of(source: str) -> str | None:
    """The task a `reasoning_gym:TASK` source names; None for any other source."""
    return source.removeprefix(PREFIX) if source.startswith(PREFIX) else None


def task_specs(task: str, cfg: ReasoningGymSettings) -> list[TaskSpec]:
    """The tasks of a source with their weights and configs; ValueError, one line, naming a bad
    task or key."""
    if task == COMPOSITE:
        if not cfg.tasks:
            raise ValueError("reasoning_gym:composite needs reasoning_gym.tasks")
        if cfg.config:
            raise ValueError(
                "reasoning_gym.config is for one task; with composite put each task's "
                "config under reasoning_gym.tasks.NAME.config"
            )
        specs = [TaskSpec(n, t.weight, dict(t.config)) for n, t in cfg.tasks.items()]
    else:
        if cfg.tasks:
            raise ValueError(
                f"reasoning_gym.tasks mixes several tasks: set data.source to "
                f"reasoning_gym:{COMPOSITE}, or drop tasks to train on {task}"
            )
        specs = [TaskSpec(task, 1.0, dict(cfg.config))]
    for spec in specs:
        check_task(spec.name, spec.config)
    return specs


def check_task(name: str, config: Mapping[str, Any]) -> None:
    """ValueError naming an unknown task (with close matches) or config key (with the valid
    keys), or what the task's own config check says of a value."""
    datasets = _registry()
    if name not in datasets or name == COMPOSITE:
        known = sorted(n for n in datasets if n != COMPOSITE)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(
            f"reasoning_gym: unknown task {name!r}; {hint}{len(known)} tasks, e.g. "
            f"{', '.join(known[:6])} (docs/reasoning-gym.md)"
        )
    keys = [f.name for f in dataclasses.fields(datasets[name][1]) if f.name not in SET_BY_RECIPE]
    for key in config:
        if key in SET_BY_RECIPE:
            raise ValueError(
                f"reasoning_gym {name}: {key!r} is set by data.reasoning_gym.{key}, "
                "not by the task's config"
            )
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"reasoning_gym {name}: unknown config key {key!r}; {hint}"
                f"valid keys: {', '.join(keys)}"
            )
    dataset = _build(name, dict(config), seed=0, size=1)
    try:
        dataset[0]  # some configs pass the task's checks yet cannot make a problem
    except Exception as exc:  # a generator's failure has no one type; it means "bad config"
        raise ValueError(
            f"reasoning_gym {name}: cannot generate a problem with this config "
            f"({type(exc).__name__}: {exc})"
        ) from None


def _registry() -> dict[str, Any]:
    import reasoning_gym  # registers every task on import

    return dict(reasoning_gym.factory.DATASETS)


def _build(name: str, config: dict[str, Any], seed: int, size: int) -> Any:
    """A task's dataset; ValueError with the task's own complaint about a config value."""
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, **config, seed=seed, size=size)
    except (AssertionError, TypeError, ValueError, KeyError) as exc:  # its config checks
        raise ValueError(
            f"reasoning_gym {name}: bad config ({exc or type(exc).__name__})"
        ) from None


def _mixed(specs: list[TaskSpec], seed: int, size: int) -> Any:
    """One task's dataset, or reasoning-gym's composite of several, drawn by weight per index."""
    if len(specs) == 1:
        return _build(specs[0].name, specs[0].config, seed, size)
    from reasoning_gym.composite import DatasetSpec

    datasets = [DatasetSpec(s.name, s.weight, s.config) for s in specs]
    return _build(COMPOSITE, {"datasets": datasets}, seed, size)


def _entries(specs: list[TaskSpec], seed: int, size: int) -> Iterator[tuple[int, Any]]:
    """The dataset's problems by index; ValueError naming the one its generator failed on (some
    tasks run out of distinct problems, or overflow, far into a large `size`)."""
    dataset = _mixed(specs, seed, size)
    for i in range(size):
        try:
            entry = dataset[i]
        except Exception as exc:  # a generator's failure has no one type
            names = ", ".join(s.name for s in specs)
            raise ValueError(
                f"reasoning_gym {names}: the generator failed at problem {i} of {size} "
                f"({type(exc).__name__}: {exc}); lower data.reasoning_gym.size"
            ) from None
        yield i, entry


def _rows(source: str, specs: list[TaskSpec], seed: int, size: int, split: str) -> list[Any]:
    configs = {s.name: s.config for s in specs}
    rows = []
    for i, entry in _entries(specs, seed, size):
        task = entry["metadata"]["source_dataset"]
        gold = entry["answer"]
        rows.append(
            {
                "prompt": entry["question"],
                # tasks with several right answers have none: their verifier checks an answer
                "answer": "" if gold is None else str(gold),
                TASK_COLUMN: task,
                ENTRY_COLUMN: {
                    "task": task,
                    "config": configs[task],
                    "question": entry["question"],
                    "answer": gold,
                    "metadata": entry["metadata"],
                },
                "id": f"{source}/{split}/{i}",
            }
        )
    return rows


def reasoning_gym_split(source: str, cfg: ReasoningGymSettings, seed: int, split: str) -> Splits:
    """The training rows (`split` "train") and the held-out rows, and the dropped-rows note."""
    if split not in ("train", "test"):
        raise ValueError(f"{source} has splits train and test, not {split!r}")
    key = json.dumps(
        [[list(s) for s in _specs(source, cfg)], cfg.size, cfg.eval_size, cfg.seed, seed],
        sort_keys=True,
        default=str,
    )
    return _splits(source, key)


def _specs(source: str, cfg: ReasoningGymSettings) -> list[TaskSpec]:
    task = task_of(source)
    if task is None:
        raise ValueError(f"{source} is not a reasoning_gym: source")
    return task_specs(task, cfg)


@lru_cache(maxsize=4)  # the training and held-out splits are asked for separately
def _splits(source: str, key: str) -> Splits:
    raw_specs, size, eval_size, own_seed, data_seed = json.loads(key)
    specs = [TaskSpec(*s) for s in raw_specs]
    seed = data_seed if own_seed is None else own_seed
    train = _rows(source, specs, seed, size, "train")
    held = _rows(source, specs, seed + HELDOUT_SEED_OFFSET, eval_size, "test")
    unique = list({r["prompt"]: r for r in reversed(held)}.values())[::-1]  # first of each
    asked = {r["prompt"] for r in unique}
    kept = [r for r in train if r["prompt"] not in asked]
    repeats, overlap = len(held) - len(unique), len(train) - len(kept)
    note = None
    if repeats or overlap:
        note = (
            f"data: {source}: {overlap} of {len(train)} training problems ask a held-out "
            f"question and {repeats} of {eval_size} held-out problems repeat one: dropped"
        )
    return Splits(kept, unique, note)


@lru_cache(maxsize=64)
def scoring_dataset(task: str, config_json: str) -> Any:
    """The task's dataset as configured, for its `score_answer` (some verifiers read their
    config)."""
    return _build(task, json.loads(config_json), seed=0, size=1)
