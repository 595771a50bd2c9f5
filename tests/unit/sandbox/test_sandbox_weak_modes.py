"""The weak isolation modes (unshare, rlimits): refused unless the user opts in, and, when
opted into, closed against the escapes an attack review found in them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gspo_cli.recipe.reward import RewardConfig
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.code import code_reward, judge_completions, judge_program
from gspo_cli.sandbox import isolation as iso
from gspo_cli.sandbox import run_program
from gspo_cli.sandbox.isolation import WeakIsolationError
from gspo_cli.sandbox.program import Limits
from gspo_cli.train.step.rewards import WeightedRewards

# The container stage of CI runs these too: which weak modes work depends on the container.
pytestmark = pytest.mark.container

WEAK = [m for m in iso.available_modes() if m != "bwrap"]
FAST = Limits(time_limit_s=2.0)
TESTS = {"inputs": [""], "outputs": ["escaped"]}
FENCED = "```python\nprint(1)\n```"


def judge(code: str, mode: str) -> str:
    return judge_program(
        code, TESTS, limits=FAST, isolation=mode, allow_weak_isolation=True
    ).verdict


@pytest.fixture
def only_weak_modes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine as if bubblewrap were missing."""
    monkeypatch.delenv(iso.ENV_VAR, raising=False)
    real_probe = iso._probe
    monkeypatch.setattr(
        iso, "_probe", lambda m: "bwrap is not installed" if m == "bwrap" else real_probe(m)
    )
    iso._detect_mode.cache_clear()
    yield
    monkeypatch.undo()
    iso._detect_mode.cache_clear()


@pytest.mark.parametrize("mode", ["unshare", "rlimits"])
def test_weak_modes_are_refused_without_the_opt_in(mode: str) -> None:
    with pytest.raises(WeakIsolationError) as info:
        judge_program("print(1)", {"inputs": [""], "outputs": ["1"]}, isolation=mode)
    message = str(info.value)
    assert "\n" not in message and "reward.sandbox.allow_weak_isolation" in message
    with pytest.raises(WeakIsolationError):
        run_program("print(1)", isolation=mode)
    with pytest.raises(WeakIsolationError):  # once, up front: not one internal_error per sample
        judge_completions(
            [FENCED, "no code"], [{"inputs": [""], "outputs": ["1"]}] * 2, isolation=mode
        )


@pytest.mark.usefixtures("only_weak_modes")
def test_without_bubblewrap_the_code_reward_stops_with_one_line() -> None:
    with pytest.raises(WeakIsolationError, match="bwrap is not installed"):
        code_reward([FENCED], [{"inputs": [""], "outputs": ["1"]}])
    cfg = RewardConfig.model_validate({"functions": [{"name": "code"}]})
    with pytest.raises(WeakIsolationError):  # at bind time, before any model is loaded
        WeightedRewards(cfg, RewardServices())
    opted = RewardConfig.model_validate(
        {"functions": [{"name": "code"}], "sandbox": {"allow_weak_isolation": True}}
    )
    try:
        WeightedRewards(opted, RewardServices())
        assert code_reward([FENCED], [{"inputs": [""], "outputs": ["1"]}]) == [1.0]
    finally:
        iso.allow_weak_isolation(False)


def test_bubblewrap_needs_no_opt_in() -> None:
    if "bwrap" not in iso.available_modes():
        pytest.skip("bubblewrap does not work here")
    assert (
        judge_program("print(1)", {"inputs": [""], "outputs": ["1"]}, isolation="bwrap").verdict
        == "accepted"
    )


GUARD_OFF = """
import builtins, posix, sys
harness = [m for m in list(sys.modules.values()) if "harness" in (getattr(m, "__file__", "") or "")]
for module in [sys.modules["__main__"], *harness]:  # the harness's modules: every constant emptied,
        for name, value in list(vars(module).items()):  # every function made permissive
            if name.isupper() and isinstance(value, (frozenset, set, tuple, dict)):
                setattr(module, name, type(value)())
            elif callable(value) and not isinstance(value, type) and name[:1] == "_":
                setattr(module, name, lambda *a, **k: True)
builtins.type = lambda *a: str
builtins.any = lambda *a: False
posix.lstat = lambda *a: None
"""


# Every closure reachable from the program's frames (and from a refused call's traceback)
# gets its tuples widened to "/", as an attack on the guard's own state would.
CLOSURES = """
import sys
def widen(value):
    for fn in [value, *vars(value).values()] if isinstance(value, type(sys)) else [value]:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if isinstance(cell.cell_contents, tuple):
                    cell.cell_contents = ("/",)
            except Exception:
                pass
frame = sys._getframe()
while frame is not None:
    for value in [*frame.f_locals.values(), *frame.f_globals.values()]:
        widen(value)
    frame = frame.f_back
try:
    open("/etc/hostname")
except Exception as exc:
    tb = exc.__traceback__
    while tb is not None:
        try:
            for value in tb.tb_frame.f_locals.values():
                widen(value)
        except Exception:
            pass
        tb = tb.tb_next
"""


@pytest.mark.parametrize("mode", WEAK)
@pytest.mark.parametrize("tamper", [GUARD_OFF, CLOSURES], ids=["globals", "closures"])
def test_the_guard_survives_pure_python_tampering(mode: str, tamper: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)\n"
        assert judge(tamper + connect + "print('escaped')", mode) in ("blocked", "runtime_error")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the listening socket
    read = "print(open('/etc/hostname').read(), 'escaped')"
    assert judge(tamper + read, mode) in ("blocked", "runtime_error")


@pytest.mark.parametrize("mode", WEAK)
def test_dir_fd_paths_do_not_bypass_the_guard(mode: str) -> None:
    via_fd = (
        "import os\nfd = os.open('/usr/lib', os.O_RDONLY)\n"
        "print(os.read(os.open('../../etc/hostname', os.O_RDONLY, dir_fd=fd), 99), 'escaped')"
    )
    via_opener = (
        "import os\nfd = os.open('/usr/lib', os.O_RDONLY)\n"
        "print(open('../../etc/hostname', opener=lambda p, f: os.open(p, f, dir_fd=fd)).read())\n"
        "print('escaped')"
    )
    mkdir = (
        "import os\nfd = os.open('/usr/lib', os.O_RDONLY)\nos.mkdir('../../tmp/x', dir_fd=fd)\n"
        "print('escaped')"
    )
    for code in (via_fd, via_opener, mkdir):
        assert judge(code, mode) in ("blocked", "runtime_error")


@pytest.mark.parametrize("mode", WEAK)
def test_no_fifos_shared_memory_or_dns(mode: str) -> None:
    shm = Path("/dev/shm")
    before = set(shm.iterdir())
    attacks = [
        f"import os\nos.mkfifo('/dev/shm/gspo-fifo-{os.getpid()}')\nprint('escaped')",
        f"import posix\nposix.mkfifo('/dev/shm/gspo-fifo-{os.getpid()}')\nprint('escaped')",
        "import _posixshmem, os\n_posixshmem.shm_open('/gspo-shm', os.O_CREAT | os.O_RDWR)\n"
        "print('escaped')",
        f"open('/dev/shm/gspo-file-{os.getpid()}', 'w').write('x' * 99)\nprint('escaped')",
        "import socket\nsocket.gethostbyname('localhost')\nprint('escaped')",
        "import _socket\n_socket.socketpair()\nprint('escaped')",  # raises no audit event
    ]
    for code in attacks:
        assert judge(code, mode) in ("blocked", "runtime_error"), code
    assert set(shm.iterdir()) <= before


def test_kernel_helpers_set_no_new_privs_and_deny_sockets() -> None:
    """The harness's prctl and seccomp calls, observed from a fresh interpreter."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import kernel, socket\n"
        "kernel.no_new_privs(); assert kernel.deny_sockets_and_tracing()\n"
        "status = open('/proc/self/status').read()\n"
        "print([l for l in status.splitlines() if l.startswith(('NoNewPrivs', 'Seccomp:'))])\n"
        "try:\n    socket.socket()\nexcept PermissionError:\n    print('denied')\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(iso.HARNESS)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "NoNewPrivs:\\t1" in done.stdout and "Seccomp:\\t2" in done.stdout, done.stderr
    assert done.stdout.strip().endswith("denied")
