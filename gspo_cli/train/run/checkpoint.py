"""Checkpoints: HF-format weights + trainer state, written atomically, newest found on resume.

A checkpoint is first written to a hidden temporary folder and then renamed into place, and the
`latest` pointer is replaced atomically afterwards: a kill at any moment leaves the previous
checkpoint intact and pointed to.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import (
    LATEST,
    STEP_GLOB,
    TRAINER_STATE,
    remove_partial,
    staging,
    step_folder,
    write_error,
    write_text_atomic,
)
from gspo_cli.runs.retention import Retention, checkpoints, kept_by, metric_by_step, step_of
from gspo_cli.train.engines.distributed import LOCAL, DistContext
from gspo_cli.train.engines.torch_engine import TrainEngine


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(
    root: Path,
    step: int,
    engine: TrainEngine,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    keep: Retention,
    ctx: DistContext = LOCAL,
    *,
    keep_before: int | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint `step_NNNNNN` under `root` and point `latest` at it; prune old ones.

    `keep` says which are kept (runs/retention.py), and besides them the newest at or before
    step `keep_before`: the one a guard goes back to, which pruning must not take (step 0
    included). `extra` writes this rank's own files into the folder (asynchronous rollouts:
    the in-flight batches).
    Every rank calls this (DeepSpeed saves are collective); rank 0 writes the shared files.
    """
    if not engine.weights_finite():  # never let a broken state become `latest`
        good = latest_checkpoint(root, cleanup=False)
        raise GspoError(
            f"step {step}: the weights are not finite, so no checkpoint is written; the last "
            f"good one is {good or 'none (start over)'}"
        )
    final = root / step_folder(step)
    tmp = root / staging(final.name)
    short = ctx.all_gather(space_problem(root, final.name) if ctx.is_main else None)
    if any(short):  # every rank stops: the save is collective
        raise GspoError(next(p for p in short if p))
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            raise write_error(exc, root) from None
    ctx.barrier()
    try:
        _write(tmp, step, engine, tokenizer, state, ctx, extra)
    except BaseException as exc:
        # A full disk must not leave a half-written folder behind, nor a traceback.
        problem = remove_partial(tmp, exc, root) if ctx.is_main else None
        if problem is None:
            raise
        raise GspoError(f"{problem}: checkpoint {final.name} not saved ({kept(root)})") from None
    if ctx.is_main:
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        write_text_atomic(root / LATEST, final.name)
        _prune(root, keep, keep_before)
    ctx.barrier()
    return final


def space_problem(root: Path, name: str) -> str | None:
    """The one line refusing a save the disk cannot hold, judged by the newest checkpoint's
    size (a first save is not judged: a disk that fills during it is reported as full and the
    half-written folder removed); None when it fits."""
    previous = checkpoints(root)
    if not previous:
        return None
    needed = sum(f.stat().st_size for f in previous[-1].rglob("*") if f.is_file())
    free = shutil.disk_usage(root).free
    if free >= needed * 1.05:  # a margin: the next save may be a little larger
        return None
    return (
        f"checkpoint {name} needs about {needed / 1024**3:.2f} GiB (as {previous[-1].name} "
        f"took) and the disk of {root} has {free / 1024**3:.2f} GiB free: free some space, or "
        f"keep fewer checkpoints (trainer.keep_checkpoints, keep_best, keep_every), then "
        f"--resume ({kept(root)})"
    )


def _prune(root: Path, policy: Retention, keep_before: int | None) -> None:
    """Delete the checkpoints `policy` does not keep (train/run/retention.py), never the one a
    rollback after the next steps restores."""
    anchor = None if keep_before is None else checkpoint_at_or_before(root, keep_before)
    scores = metric_by_step(root.parent, policy.metric) if policy.best else {}
    folders = checkpoints(root)
    keep = kept_by(folders, policy, scores)
    for old in folders:
        if old not in keep and old != anchor:
            shutil.rmtree(old, ignore_errors=True)


def _write(
    tmp: Path,
    step: int,
    engine: TrainEngine,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    ctx: DistContext,
    extra: Callable[[Path], None] | None,
) -> None:
    engine.save_model(tmp, tokenizer)
    engine.save_state(tmp)
    if extra is not None:
        extra(tmp)
    if ctx.is_main:
        torch.save({**state, "step": step, "rng": rng_state()}, tmp / TRAINER_STATE)
    ctx.barrier()
    if ctx.is_main:
        _fsync_tree(tmp)


def kept(root: Path) -> str:
    """What a resume would use after a failed save, for the error line."""
    pointer = root / LATEST
    if not pointer.is_file():
        return "there is no earlier checkpoint"
    return f"{pointer.read_text(encoding='utf-8').strip()} is intact"


def latest_checkpoint(root: Path, *, cleanup: bool = True) -> Path | None:
    """The folder `latest` points to, or None when there is no checkpoint yet."""
    for tmp in root.glob(staging(STEP_GLOB)) if cleanup else []:  # left by a kill during a save
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text(encoding="utf-8").strip()
    if not (folder / TRAINER_STATE).is_file():
        raise GspoError(f"checkpoint {folder} is incomplete or missing; remove it to start over")
    return folder


def load_trainer_state(folder: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(folder / TRAINER_STATE, weights_only=False)
    except Exception as exc:  # pickle/zip errors of many kinds all mean a corrupted file
        raise GspoError(f"checkpoint {folder / TRAINER_STATE} is corrupted: {exc}") from None
    return state


def checkpoint_at_or_before(root: Path, step: int) -> Path | None:
    """The newest complete checkpoint folder of a step <= `step`, or None."""
    found = [f for f in checkpoints(root) if step_of(f) <= step and (f / TRAINER_STATE).is_file()]
    return found[-1] if found else None  # checkpoints(): oldest first


def roll_back_to(root: Path, folder: Path, ctx: DistContext = LOCAL) -> None:
    """Make `folder` the latest checkpoint again: newer ones hold the abandoned trajectory."""
    if ctx.is_main:
        write_text_atomic(root / LATEST, folder.name)
        for newer in checkpoints(root):
            if step_of(newer) > step_of(folder):
                shutil.rmtree(newer, ignore_errors=True)
    ctx.barrier()
