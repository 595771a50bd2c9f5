"""One writer per folder (an OS lock that dies with its holder) and the modes of atomic writes."""

from __future__ import annotations

import os
import signal
import socket
import stat
from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.runs import folder as run_folder
from gspo_cli.runs.folder import write_text_atomic
from gspo_cli.runs.lock import one_writer
from tests.support.helpers import lock_holder

# The container stage of CI runs these too: file modes, locks and the non-root user.
pytestmark = pytest.mark.container


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
