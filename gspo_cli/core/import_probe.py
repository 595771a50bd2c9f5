"""Import a user's reward module in a child process first, so that it cannot end or hang gspo.

A module that calls `sys.exit(0)` or `os._exit(0)` at import (a script turned into a reward,
its `main()` unguarded) would end `gspo validate` or `gspo train` with exit 0, no output and no
run; one that blocks at import (waits for input, a server, a lock) would hang it in silence.
The child imports the module under a deadline with the same import path as gspo; an exit, a
hang or a crash there is one line naming the module. A module that imports fine there is then
imported in gspo, as before; one that raises is left to that import, whose message names the
exception.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

from gspo_cli.core.workers import die_with_parent_argv

IMPORT_TIMEOUT_S = 60.0  # the longest a reward module may take to import
IMPORT_TIMEOUT_ENV = "GSPO_REWARD_IMPORT_TIMEOUT_S"  # overrides it (a slow shared file system)

_OK, _EXIT, _RAISED = "ok", "exit", "raised"
_MARK = "\x00gspo-import-probe:"  # before the verdict on stdout, after anything the module prints

# argv: the module, gspo's import path as JSON
_CHILD = f"""
import importlib, json, sys
sys.path[:] = json.loads(sys.argv[2])
def verdict(text):
    sys.stdout.write({_MARK!r} + text)
    sys.stdout.flush()
try:
    importlib.import_module(sys.argv[1])
except SystemExit as exc:
    verdict({_EXIT!r} + ":" + repr(exc.code))
except BaseException:
    verdict({_RAISED!r})
else:
    verdict({_OK!r})
"""

_probed: set[str] = set()  # modules this process has checked already


def import_timeout_s() -> float:
    """`IMPORT_TIMEOUT_S`, or the environment's `GSPO_REWARD_IMPORT_TIMEOUT_S`."""
    text = os.environ.get(IMPORT_TIMEOUT_ENV, "").strip()
    if not text:
        return IMPORT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{IMPORT_TIMEOUT_ENV}={text!r}: must be a positive number of seconds")
    return value


def probe_import(reward: str, module: str) -> None:
    """Return once `module` imports in a child process without ending it or hanging; ValueError
    naming `reward` and `module` otherwise. A module already imported here is not probed."""
    if module in _probed or module in sys.modules:
        return
    timeout = import_timeout_s()
    child = subprocess.Popen(
        [*die_with_parent_argv(), sys.executable, "-c", _CHILD, module, json.dumps(sys.path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a group of its own: what the module started ends with it
    )
    try:
        out, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        raise ValueError(
            f"reward {reward!r}: importing {module!r} did not finish within {timeout:g} s "
            f"(limit: {IMPORT_TIMEOUT_ENV}, default {IMPORT_TIMEOUT_S:g}); a reward module "
            "must not block when imported"
        ) from None
    finally:
        _kill_group(child)  # anything it started and left behind
    problem = _problem(out.decode("utf-8", "replace"), child.returncode)
    if problem is not None:
        raise ValueError(f"reward {reward!r}: importing {module!r} {problem}")
    _probed.add(module)


def _problem(out: str, code: int) -> str | None:
    """What went wrong in the child, from its verdict and exit code; None when it imported (or
    raised: gspo's own import then names the exception)."""
    verdict = out.rpartition(_MARK)[2] if _MARK in out else None
    if verdict in (_OK, _RAISED):
        return None
    hint = "; keep script code under `if __name__ == '__main__':`"
    if verdict is not None and verdict.startswith(f"{_EXIT}:"):
        return f"called sys.exit({verdict.partition(':')[2]}){hint}"
    if code < 0:
        return f"killed its process (signal {-code}: a crash in C code?)"
    return f"ended its process (exit code {code}, e.g. os._exit){hint}"


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
