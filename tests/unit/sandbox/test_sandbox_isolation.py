"""Code sandbox: hostile programs end with reward 0, a verdict, and nothing left behind.

Every property is checked in every isolation mode that works on this machine (bwrap, unshare,
and the rlimits fallback, which always does), so the fallbacks are proven too.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gspo_cli.rewards.code import judge_completions, judge_program
from gspo_cli.sandbox import SandboxPool, run_program
from gspo_cli.sandbox import isolation as iso
from gspo_cli.sandbox.launch import MARKER_PREFIX, Limits, run_prefix

# The container stage of CI runs these too: the sandbox's isolation depends on where it runs.
pytestmark = pytest.mark.container

MODES = iso.available_modes()
FAST = Limits(time_limit_s=0.5, output_limit_bytes=1 << 20)
GOOD = "print(int(input()) * 2)"
GOOD_TESTS = {"inputs": ["21\n"], "outputs": ["42\n"]}
OURS = MARKER_PREFIX + run_prefix()  # another process's sandboxes are not ours to check
SLEEP = f"987.{os.getpid()}"  # the daemon test's sleep, likewise


def sandboxed_processes() -> list[str]:
    """Command lines of live processes started by any sandbox (the marker is in their argv)."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        try:
            cmdline = (proc_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if OURS.encode() in cmdline or (SLEEP + "\0").encode() in cmdline:
            found.append(cmdline.decode(errors="replace"))
    return found


def opt_in(mode: str) -> dict[str, object]:
    """A weak mode judges untrusted code only with the explicit opt-in."""
    return {"isolation": mode, "allow_weak_isolation": mode != "bwrap"}


def judge(code: str, expected: str, mode: str, limits: Limits = FAST) -> str:
    """Judge `code` on one empty-input test expecting `expected`; returns the verdict."""
    tests = {"inputs": [""], "outputs": [expected]}
    result = judge_program(code, tests, limits=limits, **opt_in(mode))
    assert result.reward() == 0.0 or result.verdict == "accepted"
    return result.verdict


@pytest.fixture(autouse=True)
def nothing_left_running() -> Iterator[None]:
    yield
    assert sandboxed_processes() == []


@pytest.mark.skipif(os.getuid() == 0, reason="root's programs run as a private uid")
@pytest.mark.parametrize("mode", [m for m in MODES if m != "bwrap"])
def test_a_trainer_with_many_threads_leaves_the_program_its_processes(mode: str) -> None:
    """Without a private uid the program shares ours, and RLIMIT_NPROC counts every thread of
    the uid: the limit must count the trainer's threads, not only its processes (the container
    CI, non-root, failed every rlimits run once the suite's process held a few dozen threads)."""
    release = threading.Event()
    threads = [threading.Thread(target=release.wait, daemon=True) for _ in range(40)]
    for thread in threads:
        thread.start()
    try:
        out = run_program("print('ran')", limits=FAST, **opt_in(mode))  # the harness forks
        assert out.stdout.decode().strip() == "ran", out.status
    finally:
        release.set()


@pytest.mark.parametrize("mode", MODES)
def test_normal_program_runs_under_its_limits(mode: str) -> None:
    code = (
        "import os, resource as R\n"
        "kinds = (R.RLIMIT_CPU, R.RLIMIT_AS, R.RLIMIT_FSIZE, R.RLIMIT_NOFILE)\n"
        "print(os.getuid() != 0, [R.getrlimit(k)[0] for k in kinds])"
    )
    out = run_program(code, limits=FAST, **opt_in(mode)).stdout.decode()
    assert out.strip().endswith(f"[1, {1024**3}, {16 * 1024**2}, 64]")
    if os.getuid() == 0:
        assert out.startswith("True")  # root's programs run as a private uid
    assert judge_program(GOOD, GOOD_TESTS, **opt_in(mode)).verdict == "accepted"
    common = (
        "import sys, threading\nsys.setrecursionlimit(10**5)\nthreading.stack_size(1 << 26)\n"
        "def main():\n    data = open('/dev/stdin').read()\n"
        "    print(int(data) * 2)\nthreading.Thread(target=main).start()"
    )  # idioms of competitive Python must survive the guard
    assert judge_program(common, GOOD_TESTS, **opt_in(mode)).verdict == "accepted"
    library = (  # stdlib that inspects frames or lists the cwd must survive the guard too
        "import enum, os\nfrom collections import namedtuple\nfrom dataclasses import dataclass\n"
        "from pathlib import Path\nP = namedtuple('P', 'x')\nColor = enum.Enum('Color', 'RED')\n"
        "@dataclass\nclass D:\n    x: int\nPath('f.txt').write_text(input())\n"
        "print(int(Path('f.txt').read_text()) * 2, os.listdir(), P(1).x, D(2).x, Color.RED.value)"
    )
    tests = {"inputs": ["21\n"], "outputs": ["42 ['f.txt'] 1 2 1"]}
    assert judge_program(library, tests, **opt_in(mode)).verdict == "accepted"


@pytest.mark.parametrize("mode", MODES)
def test_secrets_in_the_environment_do_not_leak(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_leak_me_123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_leak_me_456")
    code = (
        "import os\n"
        "parts = [os.environ.get(k, '') for k in ('HF_TOKEN', 'AWS_SECRET_ACCESS_KEY')]\n"
        "for pid in (os.getppid(), 1):\n"
        "    try:\n        parts.append(open(f'/proc/{pid}/environ').read())\n"
        "    except OSError:\n        pass\n"
        "print('hf_leak_me_123' if 'hf_leak_me_123' in ''.join(parts) else 'clean')"
    )
    assert judge(code, "hf_leak_me_123", mode) != "accepted"
    assert b"clean" in run_program(code, limits=FAST, **opt_in(mode)).stdout


@pytest.mark.parametrize("mode", MODES)
def test_no_network_even_to_localhost(mode: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)\nprint('connected')"
        )
        assert judge(code, "connected", mode) in ("runtime_error", "blocked")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever reached the listening socket


@pytest.mark.parametrize("mode", MODES)
def test_host_files_cannot_be_read(mode: str, tmp_path: Path) -> None:
    private = tmp_path / "secret.txt"
    private.write_text("private-secret")
    public_dir = Path(tempfile.mkdtemp(prefix="gspo-test-public-"))
    try:
        public_dir.chmod(0o755)  # world-readable: only the sandbox itself can stop a read
        public = public_dir / "secret.txt"
        public.write_text("public-secret")
        public.chmod(0o644)
        for path, text in ((private, "private-secret"), (public, "public-secret")):
            code = f"print(open({str(path)!r}).read())"
            assert judge(code, text, mode) in ("runtime_error", "blocked")
    finally:
        for child in public_dir.iterdir():
            child.unlink()
        public_dir.rmdir()


@pytest.mark.parametrize("mode", MODES)
def test_no_writes_outside_the_box(mode: str, tmp_path: Path) -> None:
    targets = [tmp_path / "escaped.txt", Path(tempfile.gettempdir(), f"gspo-escape-{os.getpid()}")]
    for target in targets:
        code = f"open({str(target)!r}, 'w').write('x')\nprint('wrote')"
        verdict = judge(code, "wrote", mode)
        if target.parent != Path(tempfile.gettempdir()):
            assert verdict in ("runtime_error", "blocked")  # the host folder is not even there
        assert not target.exists()  # /tmp may be the sandbox's own: the host's stays clean
    inside = (
        "import os\nopen('local.txt', 'w').write('ok')\nos.mkdir('sub')\n"
        "print(open('local.txt').read(), sorted(os.listdir()))"
    )
    assert judge(inside, "ok ['local.txt', 'sub']", mode) == "accepted"  # its own folder


@pytest.mark.parametrize("mode", MODES)
def test_each_run_gets_a_fresh_folder_removed_afterwards(mode: str) -> None:
    before = set(Path(tempfile.gettempdir()).glob(f"gspo-sbx-{run_prefix()}*"))
    code = "import os\nprint(sorted(os.listdir('.')))\nopen('mark', 'w').write('1')"
    tests = {"inputs": ["", ""], "outputs": ["[]", "[]"]}  # the 2nd run must not see 'mark'
    assert judge_program(code, tests, limits=FAST, **opt_in(mode)).verdict == "accepted"
    assert set(Path(tempfile.gettempdir()).glob(f"gspo-sbx-{run_prefix()}*")) <= before


@pytest.mark.parametrize("mode", MODES)
def test_fork_bomb_is_contained(mode: str) -> None:
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass"
    )
    assert judge(code, "", mode) in ("timeout", "runtime_error", "blocked")


@pytest.mark.parametrize("mode", MODES)
def test_memory_bomb_hits_the_memory_limit(mode: str) -> None:
    assert judge("x = bytearray(8 * 1024**3)\nprint(len(x))", "0", mode) == "memory_limit"
    grow = "xs = []\nwhile True:\n    xs.append(bytearray(64 * 1024**2))"
    limits = Limits(time_limit_s=3, memory_limit_mb=256)
    assert judge(grow, "", mode, limits) == "memory_limit"


@pytest.mark.parametrize("mode", MODES)
def test_infinite_loop_times_out_on_the_wall_clock(mode: str) -> None:
    start = time.monotonic()
    assert judge("import time\nwhile True:\n    time.sleep(0.01)", "", mode) == "timeout"
    assert judge("while True:\n    pass", "", mode) == "timeout"
    assert time.monotonic() - start < 2 * (FAST.time_limit_s + 2)


@pytest.mark.parametrize("mode", MODES)
def test_output_flood_is_cut_and_flagged(mode: str) -> None:
    outcome = run_program("while True:\n    print('x' * 4096)", limits=FAST, **opt_in(mode))
    assert outcome.output_limited and len(outcome.stdout) <= FAST.output_limit_bytes
    assert judge("while True:\n    print('x' * 4096)", "x", mode) == "output_limit"


@pytest.mark.parametrize("mode", MODES)
def test_killing_the_parent_fails(mode: str) -> None:
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('killed')"
    assert judge(code, "killed", mode) != "accepted"
    code = "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\nprint('k')"
    # The group signal reaches only the program itself (or nothing, when it is pid 1's group);
    # the checker survives either way and the run ends with a real verdict.
    assert judge(code, "k", mode) in ("accepted", "runtime_error", "blocked")


@pytest.mark.parametrize("mode", MODES)
def test_daemons_and_children_do_not_outlive_the_run(mode: str) -> None:
    daemon = (
        "import os, subprocess, time\n"
        f"try:\n    subprocess.Popen(['sleep', '{SLEEP}'], start_new_session=True)\n"
        "except Exception:\n    pass\n"
        "try:\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(100)\n"
        "except Exception:\n    pass\n"
        "print('done')"
    )
    verdict = judge(daemon, "done", mode)
    assert verdict in ("accepted", "blocked")  # the guard refuses fork in the fallback modes
    assert sandboxed_processes() == []


def test_pool_keeps_serving_after_hostile_programs() -> None:
    hostile = [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass",
        "x = bytearray(8 * 1024**3)",
        "while True:\n    pass",
        "while True:\n    print('y' * 4096)",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "def broken(:\n    pass",
    ]
    completions = [f"```python\n{c}\n```" for c in [*hostile, GOOD]] + ["no code here"]
    pool = SandboxPool(workers=2)
    try:
        results = judge_completions(
            completions, [GOOD_TESTS] * len(completions), pool=pool, time_limit_s=0.5
        )
        verdicts = [r.verdict for r in results]
        assert verdicts[-2] == "accepted" and verdicts[-1] == "no_code"
        assert verdicts[5] == "syntax_error"
        assert all(v != "accepted" for v in verdicts[:-2])
        again = judge_completions([completions[-2]], [GOOD_TESTS], pool=pool)
        assert again[0].verdict == "accepted"
    finally:
        pool.close()


def test_nproc_limit_binds_when_root() -> None:
    if os.getuid() != 0:
        pytest.skip("RLIMIT_NPROC exempts only root; non-root runs are bounded as they are")
    code = (
        "import os, time\nn = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(0.3)\n"
        "        os._exit(0)\n    n += 1\nprint(n)"
    )
    if "bwrap" not in MODES:
        pytest.skip("the fallback guard refuses fork outright; only bwrap lets forks reach it")
    outcome = run_program(code, limits=Limits(nproc=8), isolation="bwrap")
    assert 0 < int(outcome.stdout) < 8


def test_weaker_isolation_is_announced_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(iso.ENV_VAR, raising=False)
    iso.forget_detection()
    monkeypatch.setattr(iso, "_probe", lambda m: f"{m} is not installed")
    try:
        with caplog.at_level(logging.WARNING, logger=iso.__name__):
            assert iso.detect_mode() == "rlimits"
            assert iso.detect_mode() == "rlimits"
        warnings = [r.getMessage() for r in caplog.records if "WEAKEST" in r.getMessage()]
        assert len(warnings) == 1 and "bwrap is not installed" in warnings[0]
    finally:
        monkeypatch.undo()
        iso.forget_detection()


def test_the_strongest_working_mode_is_used() -> None:
    assert MODES[-1] == "rlimits"
    if os.environ.get(iso.ENV_VAR):
        pytest.skip("a mode is forced")
    assert iso.detect_mode() == MODES[0]
