"""`gspo train RECIPE --from RUN/checkpoints/step_N` (or `--from RUN --step N`): a new run that
starts from another run's checkpoint, with the recipe's changes.

The new run folder gets what the parent's checkpoint needs to be resumed, and nothing of the
parent is written: the checkpoint (weights, optimizer state, RNG, the sampler's position and
the reference policy's state), the parent's cold start, LoRA base and teacher files when it has
them (hard links where the file system allows, else copies), the parent's records up to step N
(metrics, held-out, samples, guard events), and the recipe. It is then resumed as any run is,
so a branch with no change reproduces the parent from step N record for record. Its run marker
records its `lineage` (the parent folder and step); `gspo compare` draws it from that step on.

A branch may change what the checkpoint does not depend on (the learning rate, rewards, the
loss and its clip, sampling, steps, the guards, ...); what it was made with cannot carry over
(BRANCH_FIXED: the model and its adapters, the data and the cold start, the training engine
and DeepSpeed's layout): one line naming the keys.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    COLD_START,
    EVALS,
    EVENTS,
    GGUF_BASE,
    LATEST,
    LORA_BASE,
    METRICS,
    RECIPE,
    RUN_MARKER,
    SAMPLES,
    STEP_GLOB,
    TEACHER_FILES,
    TRAINER_STATE,
    check_run_folder,
    read_jsonl,
    write_error,
    write_text_atomic,
)
from gspo_cli.runs.marker import is_run_folder
from gspo_cli.train.run.resume import saved_changes

# What a checkpoint was made with: a branch cannot change these.
BRANCH_FIXED = (
    "model.", "data.", "cold_start.", "trainer.engine", "deepspeed.", "environments",
)  # fmt: skip
RECORDS = (METRICS, EVALS, SAMPLES, EVENTS)  # cut at the branch's step
SHARED = (COLD_START, LORA_BASE, GGUF_BASE, TEACHER_FILES)  # what a resume of it may need


def branch_source(source: Path, step: int | None) -> tuple[Path, Path]:
    """(the parent run folder, its checkpoint folder) that `--from source [--step step]` names;
    GspoError in one line otherwise."""
    if (source / TRAINER_STATE).is_file() and step is None:
        run, checkpoint = source.parent.parent, source
    elif is_run_folder(source):
        run = source
        if step is None:
            try:
                name = (source / CHECKPOINTS / LATEST).read_text(encoding="utf-8").strip()
            except OSError:
                raise GspoError(f"--from: {source} has no checkpoint to branch from") from None
            checkpoint = source / CHECKPOINTS / name
        else:
            checkpoint = source / CHECKPOINTS / f"step_{step:06d}"
    else:
        raise GspoError(
            f"--from: {source} is neither a run folder nor a checkpoint folder "
            "(RUN/checkpoints/step_N, holding trainer_state.pt)"
        )
    if not (checkpoint / TRAINER_STATE).is_file():
        kept = sorted(p.name for p in (run / CHECKPOINTS).glob(STEP_GLOB) if p.is_dir())
        raise GspoError(
            f"--from: {run} has no checkpoint {checkpoint.name} (kept: "
            f"{', '.join(kept) or 'none'}; trainer.keep_checkpoints decides which stay)"
        )
    if not (run / RECIPE).is_file() or not is_run_folder(run):
        raise GspoError(f"--from: {checkpoint} is not inside a gspo run folder")
    return run, checkpoint


def branch_changes(parent: Path, recipe_yaml: str) -> list[str]:
    """`branch: KEY OLD -> NEW` for each setting the new recipe changes; GspoError naming the
    keys a checkpoint cannot carry over."""
    changed = saved_changes(parent, recipe_yaml)
    fixed = sorted(k for k in changed if any(k.startswith(p) for p in BRANCH_FIXED))
    if fixed:
        raise GspoError(
            f"--from: {', '.join(fixed)} differ from {parent / RECIPE}, and the checkpoint was "
            "made with them: a branch keeps the model, its adapters, the data, the cold start "
            "and the training engine"
        )
    return [f"branch: {k} {old} -> {now}" for k, (old, now) in sorted(changed.items())]


def _link_or_copy(source: Path, target: Path) -> None:
    """`source` (a file or a folder) at `target`, by hard links where possible."""
    if source.is_dir():
        shutil.copytree(source, target, copy_function=_link_file)
    else:
        _link_file(source, target)


def _link_file(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(source, target)


def _records_up_to(source: Path, target: Path, step: int) -> None:
    kept = [r for r in read_jsonl(source) if isinstance(r.get("step"), int) and r["step"] <= step]
    if kept:
        write_text_atomic(target, "".join(json.dumps(r) + "\n" for r in kept))


def prepare_branch(parent: Path, checkpoint: Path, run_dir: Path, recipe_yaml: str) -> int:
    """Fill the new (empty) run folder `run_dir` from `checkpoint` of `parent`; its step."""
    state = checkpoint.name
    try:
        step = int(state.removeprefix("step_"))
    except ValueError:
        raise GspoError(f"--from: {checkpoint} is not a step_N checkpoint folder") from None
    try:
        for name in SHARED:
            if (parent / name).exists():
                _link_or_copy(parent / name, run_dir / name)
        (run_dir / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        _link_or_copy(checkpoint, run_dir / CHECKPOINTS / state)
        write_text_atomic(run_dir / CHECKPOINTS / LATEST, state + "\n")
        for name in RECORDS:
            if (parent / name).is_file():
                _records_up_to(parent / name, run_dir / name, step)
        write_text_atomic(run_dir / RECIPE, recipe_yaml)
        _record_lineage(run_dir, parent, step)
    except OSError as exc:
        raise write_error(exc, run_dir) from None
    return step


def _record_lineage(run_dir: Path, parent: Path, step: int) -> None:
    marker = run_dir / RUN_MARKER
    record: dict[str, Any] = json.loads(marker.read_text(encoding="utf-8"))
    record["lineage"] = {"parent": str(parent.resolve()), "step": step}
    write_text_atomic(marker, json.dumps(record) + "\n")


def start_branch(
    source: Path, step: int | None, run_dir: Path, recipe_yaml: str, console: Console
) -> None:
    """`gspo train --from`: the new run folder `run_dir` (new or empty, and locked by the
    caller) filled from the parent's checkpoint, its changes printed; the run is then resumed."""
    parent, checkpoint = branch_source(source, step)
    if run_dir.resolve() == parent.resolve():
        raise GspoError("--from: the new run needs its own folder: pass another --out")
    check_run_folder(run_dir, resume=False)  # a branch never writes into a run that has begun
    changes = branch_changes(parent, recipe_yaml)
    at = prepare_branch(parent, checkpoint, run_dir, recipe_yaml)
    console.print(f"branch: from {checkpoint} (step {at})", highlight=False, soft_wrap=True)
    for line in changes:
        console.print(line, highlight=False, soft_wrap=True)
