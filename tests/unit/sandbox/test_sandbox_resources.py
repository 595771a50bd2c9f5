"""Code sandbox resources: a run's disk and memory are bounded as a whole, whatever a program
leaves behind is cleaned up without fail, and ending a run needs no scan of the host's
processes where a pid namespace or a cgroup is at hand. Checked in every isolation mode this
machine offers."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gspo_cli.rewards.code import judge_program
from gspo_cli.sandbox import cleanup, ending, run_program
from gspo_cli.sandbox import isolation as iso
from gspo_cli.sandbox.cgroups import layout
from gspo_cli.sandbox.launch import MARKER_PREFIX, Limits, run_prefix

# The container stage of CI runs these too: cgroups and rlimits differ inside a container.
pytestmark = pytest.mark.container

MODES = iso.available_modes()
CGROUP = layout()
OURS = MARKER_PREFIX + run_prefix()  # another process's sandboxes are not ours to check
SLEEP = f"987.{os.getpid()}"
needs_cgroup = pytest.mark.skipif(CGROUP is None, reason="no writable memory cgroup here")


def options(mode: str, limits: Limits) -> dict[str, object]:
    return {"limits": limits, "isolation": mode, "allow_weak_isolation": mode != "bwrap"}


def host_leftovers() -> set[Path]:
    """Run folders and files a sandbox could leave on the host."""
    found = set()
    for folder in (tempfile.gettempdir(), "/dev/shm"):
        found |= {
            p for p in Path(folder).iterdir() if p.name.startswith(f"gspo-sbx-{run_prefix()}")
        }
    return found


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = host_leftovers()
    yield
    assert host_leftovers() <= before
    for proc_dir in Path("/proc").iterdir():
        try:
            assert OURS.encode() not in (proc_dir / "cmdline").read_bytes()
        except OSError:
            continue


DEEP = "import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_deep_folder_chain_is_removed_and_judged(mode: str) -> None:
    # The weak modes' guard checks every path a call names, so the program's own loop grows
    # about cubically with depth: 800 levels took 15 s inside a podman overlay container (the
    # CI's), 1,100 about 40 s. The limit is headroom for that; the test is about the cleanup.
    limits = Limits(time_limit_s=120)
    result = judge_program(DEEP, {"inputs": [""], "outputs": ["deep"]}, **options(mode, limits))
    assert result.verdict == "accepted"  # never internal_error for a program's own mess


def test_remove_tree_handles_depth_locked_folders_and_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    root = tmp_path / "box"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for _ in range(1500):  # deeper than PATH_MAX allows as a path: built through descriptors
        os.mkdir("d", dir_fd=fd)
        os.symlink(str(outside), "link", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    (root / "d" / "locked").mkdir()
    (root / "d" / "locked" / "f").write_text("x")
    (root / "d" / "locked").chmod(0)
    cleanup.remove_tree(root)
    assert not root.exists() and outside.read_text() == "keep me"


FILL = (
    "n = 0\ntry:\n    while True:\n        with open(f'f{n}', 'wb') as f:\n"
    "            f.write(b'x' * (4 << 20))\n        n += 1\n        print(n, flush=True)\n"
    "except OSError as exc:\n    print('full', exc.errno)\n"
)


@pytest.mark.parametrize("mode", MODES)
def test_the_box_has_a_size_limit(mode: str) -> None:
    if mode == "rlimits" and CGROUP is None:
        pytest.skip("rlimits without a cgroup: the box is a host folder, per-file size only")
    limits = Limits(time_limit_s=10, disk_mb=16, memory_limit_mb=96)
    outcome = run_program(FILL, **options(mode, limits))
    written = [line for line in outcome.stdout.splitlines() if line.isdigit()]
    # The box's tmpfs (bwrap, unshare) or the run's memory cgroup (rlimits on /dev/shm).
    bound_mb = limits.disk_mb if mode != "rlimits" else limits.memory_limit_mb
    assert 4 * len(written) <= bound_mb
    assert b"full" in outcome.stdout or outcome.oom_killed


FORKS = (
    "import os, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
    "        x = bytearray(100 << 20)\n        for i in range(0, len(x), 4096):\n"
    "            x[i] = 1\n        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\n"
    "for pid in kids:\n    os.waitpid(pid, 0)\nprint('survived')"
)
MEMFD = (  # 8 MB per memfd keeps each under the file-size rlimit
    "import os\nfds = []\nfor _ in range(48):\n    fds.append(os.memfd_create('x'))\n"
    "    os.write(fds[-1], b'x' * (8 << 20))\nprint('survived')"
)


@needs_cgroup
@pytest.mark.parametrize("mode", MODES)
def test_memory_is_bounded_for_the_whole_run(mode: str) -> None:
    """4 children of 100 MB, and 384 MB in memfds, against a 256 MB limit: each child stays
    under its address-space limit and memfds count in none; only the run's cgroup sees it."""
    limits = Limits(time_limit_s=10, memory_limit_mb=256)
    tests = {"inputs": [""], "outputs": ["survived"]}
    forks = judge_program(FORKS, tests, **options(mode, limits)).verdict
    memfd = judge_program(MEMFD, tests, **options(mode, limits)).verdict
    if mode == "bwrap":
        assert (forks, memfd) == ("memory_limit", "memory_limit")
    else:  # the guard refuses fork, and memfd_create is gone
        assert forks == "blocked" and memfd == "runtime_error"


@pytest.mark.parametrize("mode", MODES)
def test_a_flood_of_short_lines_is_judged(mode: str) -> None:
    flood = "import sys\nsys.stdout.write('1\\n' * 2_800_000)"
    tests = {"inputs": [""], "outputs": ["1"]}
    assert judge_program(flood, tests, **options(mode, Limits())).verdict == "wrong_answer"


DAEMONS = (
    "import os, subprocess, time\n"
    f"try:\n    subprocess.Popen(['sleep', '{SLEEP}'], start_new_session=True)\n"
    "except Exception:\n    pass\n"
    "try:\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(100)\n"
    "except Exception:\n    pass\n"
    "print('done')"
)


@pytest.mark.parametrize("mode", MODES)
def test_runs_end_without_scanning_host_processes(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if mode == "rlimits" and CGROUP is None:
        pytest.skip("rlimits without a cgroup has only the /proc scan")

    def no_scan(*_: object) -> int:
        raise AssertionError("the host's processes were scanned")

    monkeypatch.setattr(ending, "_kill_marked", no_scan)
    monkeypatch.setattr(cleanup, "kill_by_uid", no_scan)
    limits = Limits(time_limit_s=2)
    tests = {"inputs": [""], "outputs": ["done"]}
    verdict = judge_program(DAEMONS, tests, **options(mode, limits)).verdict
    assert verdict in ("accepted", "blocked")  # the weak modes' guard refuses fork
    for proc_dir in Path("/proc").iterdir():  # the pid namespace or the cgroup took them all
        try:
            assert (SLEEP + "\0").encode() not in (proc_dir / "cmdline").read_bytes()
        except OSError:
            continue


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a process with two uids")
def test_kill_by_uid_finds_a_setuid_style_process() -> None:
    uid = iso.UID_BASE + iso.UID_SLOTS * 2 + 7  # unused by any run
    child = os.fork()
    if child == 0:
        os.setresuid(uid, 0, 0)  # real uid private, effective root: a setuid helper's shape
        os.execv("/bin/sleep", ["sleep", "30"])
    try:
        for _ in range(200):
            if cleanup.kill_by_uid(uid):
                break
            time.sleep(0.01)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
