"""What every recipe section shares: the base model (unknown keys are errors, no infinity or NaN),
the check of a local path, and the check of a name against its registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES, TRAIN_ENGINES
from gspo_cli.core.registry import Registry, UnknownNameError
from gspo_cli.data.sources import split_benchmark_source

LOCAL_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".yaml", ".yml", ".gguf")


def looks_local(path: str) -> bool:
    """True when `path` is meant as a file on disk rather than a hub id or a built-in."""
    return path.startswith(("/", "./", "../", "~")) or path.endswith(LOCAL_DATA_SUFFIXES)


def check_exists(path: str | None) -> str | None:
    """Reject a local path that does not exist (hub ids and built-ins pass through)."""
    benchmark = split_benchmark_source(path) if path is not None else None
    if benchmark is not None:
        local = benchmark[1]
        if local and not Path(local).expanduser().exists():
            raise ValueError(f"file not found: {local}")
        return path
    if path is None or not looks_local(path):
        return path
    if not Path(path).expanduser().exists():
        raise ValueError(f"file not found: {path}")
    return path


def registered(kind: str, name: str) -> str:
    """Check `name` against the registry of `kind` (e.g. "algorithm", "training engine"): the
    registries are the one list of names. An unknown name is the registry's one-line error,
    which lists the known names."""
    try:
        _registry(kind).get(name)
    except UnknownNameError as exc:
        raise ValueError(str(exc)) from None
    return name


def _registry(kind: str) -> Registry[Any]:
    """The registry of `kind`.

    The algorithm registries are imported here, not at module level: they import torch, and a
    recipe's types and ranges are checked before that.
    """
    engines: dict[str, Registry[Any]] = {
        "rollout engine": ROLLOUT_ENGINES,
        "training engine": TRAIN_ENGINES,
    }
    if kind in engines:
        return engines[kind]
    from gspo_cli.algorithms import LOSS_AGGREGATIONS, LOSS_SPECS, ROLLOUT_CORRECTIONS
    from gspo_cli.algorithms.kl import KL_ESTIMATORS

    registries: dict[str, Registry[Any]] = {
        "algorithm": LOSS_SPECS,
        "kl estimator": KL_ESTIMATORS,
        "loss aggregation": LOSS_AGGREGATIONS,
        "rollout correction": ROLLOUT_CORRECTIONS,
    }
    return registries[kind]


class Section(BaseModel):
    # No recipe number means infinity or NaN: `.inf` as a coefficient or temperature would only
    # fail at run time, as non-finite losses.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
