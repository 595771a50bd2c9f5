"""One writer per folder (an OS lock that dies with its holder) and the modes of atomic writes."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gspo_cli import run_folder
from gspo_cli.errors import GspoError
from gspo_cli.run_folder import one_writer, write_text_atomic
from tests.conftest import REPO

# Holds the lock on argv[1] until killed; with argv[2] == "fork", first forks a child that
# outlives it (as a maths verifier worker would for a moment), and prints the child's pid once
# the child runs (its fork handlers done).
HOLDER = """
import os, sys, time
from pathlib import Path
from gspo_cli.run_folder import one_writer
with one_writer(Path(sys.argv[1]), "gspo train"):
    if sys.argv[2] == "fork":
        ready, running = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(running, b"x")
            time.sleep(120)
            os._exit(0)
        os.read(ready, 1)
        print(child, flush=True)
    print("held", flush=True)
    time.sleep(120)
"""


@contextmanager
def lock_holder(folder: Path, fork: bool = False) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process holding `folder`'s lock: (the process, its forked child's pid or 0)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), "fork" if fork else "-"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        child = int(proc.stdout.readline()) if fork else 0
        assert proc.stdout.readline().strip() == "held"
        yield proc, child
    finally:
        proc.kill()
        proc.wait()


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    with (
        lock_holder(folder) as (proc, _),
        pytest.raises(GspoError) as refused,
        one_writer(folder, "gspo eval"),
    ):
        pytest.fail("a second writer got the lock")
    line = str(refused.value)
    assert f"pid {proc.pid} on host {socket.gethostname()}" in line, line
    assert line.startswith(f"{folder} is in use by gspo train") and "\n" not in line


def test_a_killed_holder_never_blocks_the_next_writer(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    with lock_holder(folder, fork=True) as (proc, child):
        proc.send_signal(signal.SIGKILL)  # no cleanup runs: the lock file stays behind
        proc.wait()
        try:
            assert (folder / run_folder.LOCK).is_file()
            os.kill(child, 0)  # the forked child still lives, and does not hold the lock
            with one_writer(folder, "gspo train"):
                assert str(os.getpid()) in (folder / run_folder.LOCK).read_text()
        finally:
            os.kill(child, signal.SIGKILL)


def test_release_removes_the_lock_file_and_frees_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "run"  # created with its parents
    for _ in range(2):
        with one_writer(folder, "gspo sft"):
            assert (folder / run_folder.LOCK).is_file()
        assert not (folder / run_folder.LOCK).exists()


def test_a_file_in_place_of_the_folder_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("keep me\n")
    with pytest.raises(GspoError, match="is a file, not a folder"), one_writer(file, "gspo eval"):
        pass
    assert file.read_text() == "keep me\n"


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_respect_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    previous = os.umask(umask)
    try:
        write_text_atomic(tmp_path / run_folder.RESULTS, "{}")
        write_text_atomic(tmp_path / run_folder.RESULTS, "{}")  # a replacement too
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / run_folder.RESULTS).stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == [run_folder.RESULTS]
