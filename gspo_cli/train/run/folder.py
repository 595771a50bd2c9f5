"""The run folder of a training run: created, or checked on resume, with its recipe saved."""

from __future__ import annotations

from pathlib import Path

from gspo_cli.runs.folder import (
    RECIPE,
    check_run_folder,
    write_error,
    write_text_atomic,
)
from gspo_cli.runs.marker import RUN, check_out_folder, mark_folder
from gspo_cli.train.run.resume import check_resumable


def prepare_run_dir(run_dir: Path, resume: bool, recipe_yaml: str) -> None:
    """Create (or, with resume, check) the run folder and save the resolved recipe in it.

    A folder a failed start left (no checkpoint, cold start, metrics) never blocks a rerun; a
    folder that is not ours (run_marker.py) is never written in."""
    check_run_folder(run_dir, resume)
    check_out_folder(run_dir, RUN, resume)  # never among a user's own files
    saved = run_dir / RECIPE
    if resume and saved.is_file():
        check_resumable(run_dir, recipe_yaml)
    try:
        mark_folder(run_dir, RUN)
        write_text_atomic(saved, recipe_yaml)
    except OSError as exc:
        raise write_error(exc, run_dir) from None
