"""Shared test fixtures: the repository root, the shared benchmark folder, a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GSPO_SHARED", REPO.parent / "shared"))


@pytest.fixture
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the real `gspo` entry point in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "gspo_cli.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def invoke_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `gspo ARGS` in this process, through the same entry point and error handling as the
    console script: a fast stand-in for `run_cli` where no process boundary is under test."""
    import contextlib
    import io

    from gspo_cli.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    argv = sys.argv
    sys.argv = ["gspo", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["gspo", *args], code, out.getvalue(), err.getvalue())


def interruptible() -> None:
    """`preexec_fn` for a child a test sends Ctrl-C: a shell starts background jobs (and CI
    may start its runner) with SIGINT ignored, which a child would inherit and keep."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
