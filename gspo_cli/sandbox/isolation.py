"""Which isolation the machine allows, probed once at runtime, and the command for each mode.

Modes, strongest first:
- ``bwrap``: bubblewrap; new network, pid, ipc and uts namespaces, a read-only /usr, and only a
  size-limited tmpfs (the box, also /tmp and /dev/shm) writable; it vanishes with the sandbox.
- ``unshare``: util-linux unshare; new network, pid, ipc, uts and mount namespaces with private
  size-limited tmpfs on /tmp (the box) and /dev/shm, but the rest of the host filesystem stays
  visible: files are guarded by the private uid, a seccomp filter and the audit-hook guard.
- ``rlimits``: no namespaces at all; rlimits, a private uid when root, no_new_privs, a seccomp
  filter against sockets, and the audit-hook guard (native code could bypass it) for files.

The two weak modes judge untrusted code only when the user opted in
(`reward.sandbox.allow_weak_isolation`, or `allow_weak_isolation=True`); otherwise judging
fails with one line saying what is missing. ``GSPO_SANDBOX_ISOLATION`` forces a mode (a weak one
still needs the opt-in).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path

from gspo_cli.core.errors import GspoError

log = logging.getLogger(__name__)
_DETECT_LOCK = threading.Lock()

MODES = ("bwrap", "unshare", "rlimits")
ENV_VAR = "GSPO_SANDBOX_ISOLATION"
# Private uids for root's runs; far above real accounts and subuid ranges.
UID_BASE = 2_100_000_000
UID_SLOTS = 512
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
HARNESS = Path(__file__).with_name("harness")


def _world_readable(path: str) -> bool:
    """True when any uid may execute `path` (every parent directory searchable)."""
    p = Path(path).resolve()
    if not p.is_file() or os.stat(p).st_mode & 0o005 != 0o005:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in p.parents)


@cache
def child_python() -> str:
    """The interpreter for programs: ours if every uid can run it, else the system one.

    Programs run stdlib-only; a private uid cannot enter e.g. /root/.pyenv.
    """
    ours = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if os.getuid() != 0 or _world_readable(ours):
        return ours
    for candidate in PYTHON_CANDIDATES:
        if _world_readable(candidate):
            return os.path.realpath(candidate)
    log.warning("code sandbox: no world-readable python found; programs may fail to import")
    return ours


def python_prefix(python: str) -> str:
    """The install root of `python` (…/bin/python3 -> …)."""
    return str(Path(python).parent.parent)


def _bwrap_fs_args(python: str) -> list[str]:
    """A minimal read-only root: /usr (and merged-usr links), the interpreter, /proc, /dev."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    prefix = python_prefix(python)
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def wrapper_command(mode: str, disk_mb: int, info_fd: int | None = None) -> list[str]:
    """The argv prefix that wraps the harness for `mode` (empty for rlimits).

    bwrap: the box is a tmpfs of `disk_mb` (with /tmp a link into it) and /dev/shm another;
    both live in the sandbox's mount namespace only. `info_fd` receives bwrap's child pid.
    """
    root = os.getuid() == 0
    if mode == "bwrap":
        ns = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        ns += ["--unshare-cgroup-try"] if root else ["--unshare-user"]
        caps = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if root else []
        size = str(disk_mb * 1024 * 1024)
        info = ["--info-fd", str(info_fd)] if info_fd is not None else []
        return [
            "bwrap", *ns, "--die-with-parent", "--new-session", *caps, *info,
            *_bwrap_fs_args(child_python()),
            "--perms", "1777", "--size", size, "--tmpfs", "/box", "--symlink", "/box", "/tmp",
            "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
            "--ro-bind", str(HARNESS), "/judge", "--chdir", "/box",
        ]  # fmt: skip
    if mode == "unshare":
        user = [] if root else ["--map-root-user"]
        return [
            "unshare", *user, "--net", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--propagation", "private", "--ipc", "--uts", "--",
        ]  # fmt: skip
    return []


def box_path(mode: str, host_box: Path | None) -> str:
    """The box (the program's cwd, HOME and TMPDIR) as the harness sees it."""
    if mode == "bwrap":
        return "/box"
    if mode == "unshare":
        return "/tmp/box"  # on the tmpfs the harness mounts
    assert host_box is not None
    return str(host_box)


def runner_path(mode: str) -> str:
    """The harness's entry script as the sandbox sees it."""
    return "/judge/start.py" if mode == "bwrap" else str(HARNESS / "start.py")


@cache
def precompile_harness() -> None:
    """Byte-compile the harness once for the programs' interpreter, so that no run compiles it
    (where the package folder is read-only, pip has usually done this at install)."""
    with suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [child_python(), "-I", "-m", "compileall", "-q", str(HARNESS)],
            capture_output=True,
            timeout=60,
        )


@cache
def _probe(mode: str) -> str | None:
    """None when `mode` runs a trivial program here, else why not."""
    tool = {"bwrap": "bwrap", "unshare": "unshare"}.get(mode)
    if tool and shutil.which(tool) is None:
        return f"{tool} is not installed"
    argv = [*wrapper_command(mode, 1), child_python(), "-I", "-c", "print('ok')"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, cwd="/", env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{tool} failed to start: {exc}"
    if done.returncode != 0 or done.stdout.strip() != b"ok":
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"{tool} does not work here ({reason[0][:160]})"
    return None


@cache
def available_modes() -> tuple[str, ...]:
    """Every mode that works on this machine, strongest first (rlimits always works)."""
    return tuple(m for m in MODES if m == "rlimits" or _probe(m) is None)


def detect_mode() -> str:
    """The mode to use: forced by GSPO_SANDBOX_ISOLATION, else the strongest that works.

    Warns once, naming what is missing, when anything weaker than bubblewrap is used.
    """
    with _DETECT_LOCK:  # pool threads may all arrive at once on first use
        return _detect_mode()


def forget_detection() -> None:
    """Probe again on next use (tests; or after `make sandbox-deps` in a live process)."""
    with _DETECT_LOCK:
        _detect_mode.cache_clear()
        _probe.cache_clear()
        available_modes.cache_clear()


@cache
def _detect_mode() -> str:
    forced = os.environ.get(ENV_VAR, "").strip()
    if forced:
        if forced not in MODES:
            raise ValueError(f"{ENV_VAR}={forced!r}; expected one of {', '.join(MODES)}")
        problem = None if forced == "rlimits" else _probe(forced)
        if problem is None:
            if forced != "bwrap":
                log.warning("code sandbox: %s isolation forced by %s", forced, ENV_VAR)
            return forced
        log.warning("code sandbox: forced mode %s unusable: %s", forced, problem)
    missing = [p for m in ("bwrap", "unshare") if (p := _probe(m))]
    mode = next(m for m in MODES if m == "rlimits" or _probe(m) is None)
    if mode == "unshare":
        log.warning(
            "code sandbox: WEAKER isolation (unshare namespaces, no filesystem namespace; "
            "host files guarded by uid and a Python audit hook) because %s. "
            "Install bubblewrap (`make sandbox-deps`).",
            "; ".join(missing),
        )
    elif mode == "rlimits":
        log.warning(
            "code sandbox: WEAKEST isolation (rlimits + process group + scrubbed env; network "
            "and host files blocked only by a Python audit hook that native code can bypass) "
            "because %s.",
            "; ".join(missing),
        )
    return mode


class WeakIsolationError(GspoError):
    """Judging untrusted code was refused: only a weak mode is available, and no opt-in."""


_allow_weak = False  # the process-wide default, set from the recipe (reward.sandbox)


def allow_weak_isolation(allowed: bool) -> None:
    """Set the default for runs that do not say: may a weak mode judge untrusted code?"""
    global _allow_weak
    _allow_weak = allowed


def checked_mode(isolation: str | None = None, allow_weak: bool | None = None) -> str:
    """The mode a run uses; raises WeakIsolationError for a weak mode without the opt-in."""
    mode = isolation or detect_mode()
    if mode not in MODES:
        raise ValueError(f"unknown isolation mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "bwrap" or (_allow_weak if allow_weak is None else allow_weak):
        return mode
    why = _probe("bwrap") or f"{mode} was asked for"
    raise WeakIsolationError(
        f"code sandbox: refusing to judge untrusted code with weak {mode} isolation ({why}); "
        "install bubblewrap (`make sandbox-deps`) or set reward.sandbox.allow_weak_isolation: "
        "true to accept it"
    )


def checker_uid(uid: int | None) -> int | None:
    """The checker's own private uid, paired with the program's."""
    return None if uid is None else uid + UID_SLOTS


@contextmanager
def private_uid() -> Iterator[int | None]:
    """A uid no other run holds (flock across threads and processes); None unless root.

    A private uid makes RLIMIT_NPROC bind (uid 0 is exempt) and lets cleanup kill by uid; the
    checker of the same run uses checker_uid(uid), so the program cannot signal or trace it.
    """
    if os.getuid() != 0:
        yield None
        return
    base = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    lock_dir = Path(base, "gspo-sandbox-uids")  # /run: only root can plant anything there
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    for slot in range(UID_SLOTS):
        fd = os.open(lock_dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            yield UID_BASE + slot
        finally:
            os.close(fd)  # closing the descriptor releases the lock
        return
    raise RuntimeError(f"code sandbox: all {UID_SLOTS} private uids are busy")
