"""Which folders gspo may write in: the run marker (`RUN_MARKER`, `.gspo-run`).

Every run folder (`gspo train`, `gspo sft`) and eval output folder (`gspo eval`) gets the marker
when it is created: `{"kind": "run"}` or `{"kind": "eval"}`, written atomically. A command writes
only in a folder that does not exist yet, is empty, or carries the marker of its kind: any other
existing folder (`--out .`, a data folder) is refused in one line before anything is written in
it, so that no file of the user's is ever overwritten or appended to.

Folders made before the marker existed are recognised by their structure and marked when next
used: a run folder by `checkpoints/` with `metrics.jsonl`, or a saved cold start with its
`recipe.yaml`; an eval folder by `settings.json` with nothing but eval files beside it. A
legacy folder with less (a failed start's lone `recipe.yaml`) is refused like any other.

`--resume` of a training run also needs a run to resume: a folder that does not exist or holds
no run (empty, or someone else's) is refused instead of starting a new run from step 0.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gspo_cli import __version__
from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    COLD_START,
    HF_CONFIG,
    LATEST,
    LOCK,
    METRICS,
    RECIPE,
    RESULTS,
    RUN_MARKER,
    SAMPLES,
    SETTINGS,
    write_error,
    write_text_atomic,
)
from gspo_cli.runs.lock import one_writer

RUN = "run"  # a training run folder (train, sft)
EVAL = "eval"  # an eval output folder
WHAT = {RUN: "a gspo run folder", EVAL: "a gspo eval output folder"}
EVAL_FILES = {SETTINGS, SAMPLES, RESULTS, LOCK}  # all a legacy eval folder may hold


def folder_kind(folder: Path) -> str | None:
    """RUN or EVAL for a folder of ours (its marker, else a legacy structure); None otherwise."""
    try:
        marker = json.loads((folder / RUN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        marker = None
    if isinstance(marker, dict) and marker.get("kind") in WHAT:
        return str(marker["kind"])
    if ((folder / CHECKPOINTS).is_dir() and (folder / METRICS).is_file()) or (
        (folder / COLD_START / HF_CONFIG).is_file() and (folder / RECIPE).is_file()
    ):
        return RUN
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if (folder / SETTINGS).is_file() and names <= EVAL_FILES:
        return EVAL
    return None


def lineage(run_dir: Path) -> dict[str, Any] | None:
    """The run's parent folder and branch step, when it was made with --from."""
    try:
        record = json.loads((run_dir / RUN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = record.get("lineage") if isinstance(record, dict) else None
    return found if isinstance(found, dict) and isinstance(found.get("step"), int) else None


def is_run_folder(path: Path) -> bool:
    """A folder a `gspo train` made (its marker, or a checkpoints/latest pointer)."""
    return path.is_dir() and (folder_kind(path) == RUN or (path / CHECKPOINTS / LATEST).is_file())


def _is_empty(folder: Path) -> bool:
    """Nothing in it but a lock file (which one_writer creates and removes)."""
    return all(p.name == LOCK for p in folder.iterdir())


def check_out_folder(folder: Path, kind: str, resume: bool = False) -> None:
    """Refuse, in one line and before anything is written, a folder that is not ours to write:
    an existing one that is neither empty nor a folder of `kind`; with `resume`, one that holds
    no run."""
    if not folder.exists():
        if resume:
            raise GspoError(f"--resume: {folder} does not exist, so there is no run to resume")
        return
    if not folder.is_dir():
        raise GspoError(f"{folder} is a file, not a folder: choose another --out")
    found = folder_kind(folder)
    if found is not None and found != kind:
        raise GspoError(f"{folder} is {WHAT[found]}, not {WHAT[kind]}: choose another --out")
    if found is None and not _is_empty(folder):
        raise GspoError(
            f"{folder} is not empty and is not {WHAT[kind]} (it has no {RUN_MARKER}): gspo "
            "never writes among other files; choose a new or empty --out"
        )
    if found is None and resume:
        raise GspoError(f"--resume: {folder} is empty, so there is no run to resume")


def mark_folder(folder: Path, kind: str) -> None:
    """Give `folder` (created if need be) the marker of `kind`, unless it has it already."""
    if folder_kind(folder) == kind and (folder / RUN_MARKER).is_file():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        record = {"kind": kind, "gspo_cli": __version__}
        write_text_atomic(folder / RUN_MARKER, json.dumps(record) + "\n")
    except OSError as exc:
        raise write_error(exc, folder) from None


@contextlib.contextmanager
def owned_folder(folder: Path, command: str, kind: str, resume: bool = False) -> Iterator[None]:
    """`one_writer` on a folder of ours: checked before it is touched, checked again under the
    lock (another process may have written it meanwhile), and marked. An empty folder's
    --resume is refused under the lock: a folder in use is reported as such."""
    if resume and not folder.exists():  # before one_writer creates it
        check_out_folder(folder, kind, resume)
    check_out_folder(folder, kind)
    made = not folder.exists()
    with one_writer(folder, command):
        try:
            check_out_folder(folder, kind, resume)
            mark_folder(folder, kind)
            yield
        except GspoError:  # a refusal (a launch check) before anything of the run was written
            if made:  # under the lock: no other writer can be using the folder
                _remove_if_bare(folder)
            raise


def _remove_if_bare(folder: Path) -> None:
    """Remove a folder this command made that holds only its marker and lock file."""
    with contextlib.suppress(OSError):  # a leftover folder is untidy, never worse
        if {p.name for p in folder.iterdir()} <= {RUN_MARKER, LOCK}:
            for name in (RUN_MARKER, LOCK):
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
