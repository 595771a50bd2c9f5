"""Child-side harness: runs ONE untrusted program for ONE test, inside the sandbox.

This file is copied next to each run and executed by a bare interpreter (`python -I`), so it
imports nothing from gspo_cli. It sets the rlimits, drops root to the run's private uid, installs
the Python audit-hook guard when the kernel gives no namespace isolation, runs the program, and
reports a one-line status on stderr prefixed by a per-run nonce the program never sees in a file.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import resource
import sys
import threading
import traceback
from typing import Any

# Names LeetCode-style solutions use without importing them (as the LiveCodeBench harness does).
HEADER = (
    "from typing import *\nfrom collections import *\nfrom heapq import *\n"
    "from bisect import *\nfrom itertools import *\nfrom functools import *\n"
    "import math, heapq, bisect, collections, itertools, functools, string, re, random, sys\n"
)
BLOCKED_EVENTS = frozenset(
    {
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
    }
)  # fmt: skip
BLOCKED_IMPORTS = frozenset({"_ctypes", "ctypes", "_posixsubprocess", "_xxsubinterpreters"})
WRITE_EVENTS = frozenset(
    {
        "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.symlink",
        "os.link", "os.truncate", "os.utime", "shutil.rmtree", "os.chflags", "os.setxattr",
    }
)  # fmt: skip
STD_STREAMS = frozenset({"/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/0", "/dev/fd/1"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxViolation(PermissionError):
    """Raised by the audit hook; a program that lets it escape gets the verdict `blocked`."""


def set_limits(spec: dict[str, Any]) -> None:
    """rlimits are set here, not in the parent, so the trainer never needs preexec_fn."""
    mb = 1024 * 1024
    cpu = int(spec["cpu_s"])
    pairs = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (spec["memory_mb"] * mb,) * 2,
        resource.RLIMIT_FSIZE: (spec["file_mb"] * mb,) * 2,
        resource.RLIMIT_NOFILE: (spec["open_files"],) * 2,
        resource.RLIMIT_NPROC: (spec["nproc"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for kind, value in pairs.items():
        resource.setrlimit(kind, value)


def die_with_trainer(parent_pid: int | None) -> None:
    """SIGKILL when the trainer dies: dropping privileges cleared the request the trainer's
    `setpriv --pdeathsig` made, so a harness that is the trainer's own child makes it again."""
    if parent_pid is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, ctypes.c_ulong(9), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if os.getppid() != parent_pid:  # the trainer died before the request: end now
        os._exit(1)


def drop_privileges(uid: int | None) -> None:
    """Root runs programs as the run's private uid: RLIMIT_NPROC does not bind uid 0."""
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("sandbox: could not drop privileges")


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def install_guard(box: str, read_roots: list[str]) -> None:
    """Weaker fallback isolation: an audit hook refusing sockets, process spawning, ctypes and
    file access outside the box. Native code could bypass it, which is why namespaces win."""
    writable = (box, "/dev/null")
    readable = (*writable, *read_roots)
    busy = threading.local()

    def resolve(raw: Any) -> str | None:
        if isinstance(raw, int) or raw in STD_STREAMS:
            return None  # an already-open descriptor: nothing new is reached
        return os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(raw)))

    def check(path: Any, write: bool) -> None:
        real = resolve(path)
        if real is not None and not _inside(real, writable if write else readable):
            raise SandboxViolation(f"sandbox: access to {real!r} is not allowed")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if getattr(busy, "on", False):
            return
        busy.on = True
        try:
            if event in BLOCKED_EVENTS:
                raise SandboxViolation(f"sandbox: {event} is not allowed")
            if event == "import" and args[0] in BLOCKED_IMPORTS:
                raise SandboxViolation(f"sandbox: import {args[0]} is not allowed")
            if event == "os.kill" and args[0] != os.getpid():
                raise SandboxViolation("sandbox: signalling other processes is not allowed")
            if event == "open":
                mode, flags = args[1], args[2] if len(args) > 2 else 0
                write = bool(mode and set(str(mode)) & set("wax+")) or bool(flags & WRITE_FLAGS)
                check(args[0], write)
            elif event in WRITE_EVENTS:
                for path in args[:2] if event in ("os.rename", "os.link") else args[:1]:
                    check(path, True)
            elif event in ("os.listdir", "os.scandir") and args:
                check(args[0], False)
        finally:
            busy.on = False

    sys.addaudithook(hook)


def load_program(code: Any, name: str) -> dict[str, Any]:
    """Run the compiled program's top level in a fresh namespace (header names preloaded)."""
    namespace: dict[str, Any] = {"__name__": name, "__builtins__": builtins}
    exec(HEADER, namespace)
    exec(code, namespace)
    return namespace


def call_function(namespace: dict[str, Any], spec: dict[str, Any]) -> str:
    """LeetCode style: Solution().fn_name(*args), one JSON argument per input line."""
    fn_name = spec["fn_name"]
    solution = namespace.get("Solution")
    fn = getattr(solution(), fn_name) if solution is not None else namespace[fn_name]
    args = [json.loads(line) for line in spec["input"].split("\n") if line.strip()]
    return json.dumps(
        fn(*args), default=lambda o: list(o) if isinstance(o, set | frozenset) else repr(o)
    )


def join_threads() -> None:
    """Programs often run main() in a big-stack thread; wait for it like the interpreter does."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the program in the spec's mode; returns the status dict reported to the parent."""
    mode = spec["mode"]
    try:
        code = compile(spec["code"], "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
        return {"status": "syntax_error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        if mode == "stdio":
            load_program(code, "__main__")
            join_threads()
            return {"status": "ok"}
        real_stdout, sys.stdout = sys.stdout, open(os.devnull, "w")  # noqa: SIM115
        namespace = load_program(code, "solution")
        if mode == "call":
            result = call_function(namespace, spec)
            real_stdout.write(f"\n{spec['nonce']} {result}\n")
        else:
            exec(compile(spec["check"], "check.py", "exec"), namespace)
        join_threads()
        real_stdout.flush()
        return {"status": "ok"}
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if mode == "stdio" and status == 0:
            return {"status": "ok"}
        return {"status": "runtime_error", "error": f"SystemExit({exc.code!r})", "exit": status}
    except BaseException as exc:  # the program's own failure, reported rather than raised
        return failure(exc, mode)


def failure(exc: BaseException, mode: str) -> dict[str, Any]:
    """Map an exception escaping the program to a status."""
    traceback.print_exception(exc, limit=-5)
    error = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, MemoryError):
        return {"status": "memory_limit", "error": error}
    if isinstance(exc, SandboxViolation) or isinstance(exc.__context__, SandboxViolation):
        return {"status": "blocked", "error": error}
    if isinstance(exc, AssertionError) and mode == "assert":
        return {"status": "wrong_answer", "error": error}  # a failed check, not a crash
    return {"status": "runtime_error", "error": error}


def act_as_init() -> None:
    """As pid 1 of a fresh pid namespace, signals without handlers are ignored; so pid 1 only
    waits and the program runs in a normal child. pid 1's exit then kills the namespace."""
    pid = os.fork()
    if pid == 0:
        return
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def main() -> None:
    if os.getpid() == 1:
        act_as_init()
    spec_path = sys.argv[1]
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    os.unlink(spec_path)  # the nonce and the code leave the filesystem before the program runs
    # Only a direct child re-arms: in a pid namespace the parent is the namespace's init, which
    # the wrapper already ties to the trainer.
    direct = os.getppid() == spec.get("parent_pid")
    set_limits(spec)
    drop_privileges(spec.get("uid"))
    die_with_trainer(spec["parent_pid"] if direct else None)
    sys.stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    exec(HEADER, {})  # import the header's modules before the guard starts watching opens
    if spec.get("guard"):
        install_guard(os.getcwd(), spec["read_roots"])
    outcome = run(spec)
    try:
        sys.stdout.flush()
    except BaseException:  # e.g. the file-size limit on a redirected stdout
        outcome = outcome if outcome["status"] != "ok" else {"status": "runtime_error"}
    sys.stderr.flush()
    os.write(2, f"\n{spec['nonce']} {json.dumps(outcome)}\n".encode())
    os._exit(0 if outcome["status"] == "ok" else 1)


if __name__ == "__main__":
    main()
