"""Harness: runs ONE untrusted program for ONE test, inside the sandbox.

Started as `python -I start.py SPEC_FD STATUS_FD CHECK_FD MARKER`; imports nothing from gspo_cli
(the check's source, with its expected values, comes on its own CHECK_FD). The
verdict never shares an interpreter with the program; there are two processes:

- the checker (this process, trusted) reads the spec, joins the run's cgroup, sets the rlimits,
  compiles the program and forks the program's process. It then drops to a uid of its own (as
  root) or makes itself undumpable (otherwise), so the program can neither signal, trace nor
  read it, and reports the outcome on STATUS_FD, a pipe the program's process closes first.
- the program's process drops to the run's private uid, installs the guard in the weak modes,
  and runs the program: stdio tests run it as __main__ (the judge compares its stdout); call
  and assert tests load it and serve calls from the checker (rpc.py), which runs the check with
  the real builtins on plain-data answers. Nothing the program prints or patches reaches the
  verdict. In the session mode (the interpreter tool) it is a live interpreter instead, running
  the cells the caller sends (session.py), and the checker reports how it ended.
"""

from __future__ import annotations

import builtins
import errno
import marshal
import os
import resource
import sys

TYPE_CHECKING = False  # typing costs milliseconds at every start: annotations only
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any, NoReturn

CODE_TYPE = type(compile("", "", "exec"))
EXIT_KINDS = {0: "ok", 1: "runtime_error", 3: "memory_limit", 4: "blocked"}
KIND_EXITS = {kind: code for code, kind in EXIT_KINDS.items()}
HERE = os.path.dirname(os.path.abspath(__file__))


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def join_cgroups(fds: list[int]) -> None:
    """Move this process into the run's cgroups ("0" is the writer); descendants follow."""
    for fd in fds:
        os.write(fd, b"0")
        os.close(fd)


def act_as_init() -> None:
    """As pid 1 of a fresh pid namespace (unshare), signals without handlers are ignored; so
    pid 1 only reaps, and the harness runs in a child. SIGTERM (sent by the judge to end the
    run) exits pid 1, and the kernel then kills the whole namespace."""
    import signal

    child = os.fork()
    if child == 0:
        return
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    while True:
        pid, status = os.wait()
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


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


def drop_privileges(uid: int | None, parent: int | None, weak: bool) -> None:
    """Root runs the program and the checker as two private uids (RLIMIT_NPROC binds them).
    Without a uid change, the weak modes still ask for the parent-death signal: with one uid
    for all, the kernel lets a dying parent's signal through."""
    if uid is None or os.getuid() != 0:
        if weak:
            __import__("kernel").die_with_parent(parent)
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("sandbox: could not drop privileges")
    import kernel

    kernel.die_with_parent(parent)


def preload(spec: dict[str, Any]) -> None:
    """Import the harness modules a run needs now, before any mount or uid change; kept out of
    main()'s locals, where the program could find them through its frames."""
    if spec["mode"] == "session":
        __import__("session")
    elif spec["mode"] != "stdio":
        __import__("rpc")
    if spec["weak"]:
        __import__("guard")
        __import__("kernel")


def prepare_weak_mode(spec: dict[str, Any]) -> None:
    """unshare/rlimits: no new privileges; under unshare, private size-limited tmpfs on /tmp
    and /dev/shm (the box lives in /tmp) that vanish with the mount namespace."""
    import kernel

    kernel.no_new_privs()
    if spec["isolation"] == "unshare":
        size = spec["disk_mb"] * 1024 * 1024
        kernel.mount_tmpfs("/tmp", size, 0o1777)
        kernel.mount_tmpfs("/dev/shm", size, 0o1777)
        os.mkdir(spec["box"], 0o700)
        if spec["uid"] is not None:
            os.chown(spec["box"], spec["uid"], spec["uid"])


def used_names(code: CodeType) -> set[str]:
    """Every name the code (and the functions and classes in it) refers to."""
    names: set[str] = set()
    todo = [code]
    while todo:
        current = todo.pop()
        names.update(current.co_names)
        todo.extend(c for c in current.co_consts if isinstance(c, CODE_TYPE))
    return names


def namespace_for(code: CodeType, name: str, header: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """A fresh module namespace holding the header names (LeetCode's implicit imports, as the
    LiveCodeBench harness gives them) that `code` uses; importing only those keeps start-up
    cheap."""
    namespace: dict[str, Any] = {"__name__": name, "__builtins__": builtins}
    for used in used_names(code) & header.keys():
        module, attribute = header[used]
        __import__(module)
        value = sys.modules[module]
        namespace[used] = getattr(value, attribute) if attribute else value
    return namespace


def join_threads() -> None:
    """Programs often run main() in a big-stack thread; wait for it like the interpreter does."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def failure(exc: BaseException) -> tuple[str, str]:
    """(kind, message) for an exception escaping the program; the traceback goes to stderr."""
    sys.__excepthook__(type(exc), exc, exc.__traceback__)  # C code: no frame audit events
    message = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return "memory_limit", message  # ENOMEM: e.g. a memfd write past the run's cgroup
    if "SandboxViolation" in (type(exc).__name__, type(exc.__context__).__name__):
        return "blocked", message
    return "runtime_error", message


def program_process(spec: dict[str, Any], code: CodeType, fds: dict[str, int]) -> NoReturn:
    """The untrusted side: never returns, and never holds the status pipe."""
    for name in ("status", "check", "to_program_w", "from_program_r", "checker_alive"):
        if name in fds:  # first of all: the verdict's pipe and the check's expected values
            os.close(fds[name])
    cells = __import__("session").take_stdin() if spec["mode"] == "session" else -1
    drop_privileges(spec["uid"], spec["harness_pid"], spec["weak"])
    if spec["guard"]:
        import guard  # loaded by main(), before the uid changed
        import kernel

        kernel.deny_sockets_and_tracing()
        guard.install(spec["box"], spec["read_roots"])
        for module in list(sys.modules):  # ctypes objects must not stay reachable
            if module.startswith(("ctypes", "_ctypes", "kernel", "guard")):
                del sys.modules[module]
    sys.path.remove(HERE)
    import io

    sys.stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    if spec["mode"] == "stdio":
        os._exit(KIND_EXITS[run_main(code, spec["header"])])
    if spec["mode"] == "session":
        sys.modules["session"].serve(cells, spec["reply_fd"], spec["cell_limit"], failure)
        os._exit(0)
    serve_calls(spec, code, fds["to_program_r"], fds["from_program_w"])
    os._exit(0)


def run_main(code: CodeType, header: dict[str, tuple[str, str]]) -> str:
    try:
        exec(code, namespace_for(code, "__main__", header))
        join_threads()
        sys.stdout.flush()
        return "ok"
    except SystemExit as exc:
        return "ok" if exc.code in (None, 0) else "runtime_error"
    except BaseException as exc:  # the program's own failure, reported by the exit code
        return failure(exc)[0]


def serve_calls(spec: dict[str, Any], code: CodeType, read_fd: int, write_fd: int) -> None:
    import rpc
    from wire import send

    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (prints of a call-based program are ignored)
    try:
        namespace = namespace_for(code, "solution", spec["header"])
        exec(code, namespace)
    except BaseException as exc:  # a crash at load: the checker's first message says so
        kind, message = failure(exc)
        send(write_fd, {"error": message, "kind": kind})
        return
    rpc.serve(namespace, read_fd, write_fd, spec["message_limit"], failure)


def check_program(spec: dict[str, Any], pid: int, fds: dict[str, int]) -> dict[str, Any]:
    """The trusted side: the verdict of the program's process for this test (a session's: how
    its process ended)."""
    if spec["mode"] in ("stdio", "session"):
        return exited(pid)
    import rpc

    peer = rpc.Peer(fds["from_program_r"], fds["to_program_w"], spec["message_limit"])
    try:
        names = peer.receive()["ok"]
        # The check sees the program's own names only: never a builtin or a header name (a
        # program's `sorted` or `math` must not stand in for the real one inside the check).
        reserved = vars(builtins).keys() | spec["header"].keys()
        remotes = {n: rpc.Remote(peer, n) for n in names if type(n) is str and n not in reserved}
        if spec["mode"] == "call":
            return {"status": "ok", "result": call_result(spec, remotes)}
        source = read_all(fds["check"]).decode("utf-8")  # never in the program's memory
        check = compile(source, "check.py", "exec", dont_inherit=True)
        namespace = namespace_for(check, "check", spec["header"])
        namespace.update(remotes)
        exec(check, namespace)
        return {"status": "ok"}
    except AssertionError as exc:
        return {"status": "wrong_answer", "error": f"AssertionError: {exc}"[:300]}
    except rpc.ProgramError as exc:
        os.close(fds["to_program_w"])  # lets a serving program finish
        return {**exited(pid), "status": exc.kind, "error": str(exc)}
    except Exception as exc:  # the check failed on the answers (e.g. a handle compared)
        return {"status": "runtime_error", "error": f"{type(exc).__name__}: {exc}"[:300]}


def call_result(spec: dict[str, Any], remotes: dict[str, Any]) -> str:
    """LeetCode style: Solution().fn_name(*args), one JSON argument per input line."""
    import json

    fn_name = spec["fn_name"]
    solution = remotes.get("Solution")
    fn = getattr(solution(), fn_name) if solution is not None else remotes[fn_name]
    args = [json.loads(line) for line in spec["input"].split("\n") if line.strip()]
    return json.dumps(
        fn(*args), default=lambda o: list(o) if isinstance(o, set | frozenset) else repr(o)
    )


def exited(pid: int) -> dict[str, Any]:
    """How the program's process ended (it ran as __main__, or stopped serving)."""
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return {"status": "runtime_error", "signal": -code}
    return {"status": EXIT_KINDS.get(code, "runtime_error"), "exit": code}


def main() -> None:
    spec_fd, status_fd, check_fd = (int(a) for a in sys.argv[1:4])
    spec: dict[str, Any] = marshal.loads(read_all(spec_fd))
    join_cgroups(spec["cgroup_fds"])
    if os.getpid() == 1:
        act_as_init()
    preload(spec)
    if spec["weak"]:
        prepare_weak_mode(spec)
    os.chdir(spec["box"])
    set_limits(spec)
    if spec["uid"] is None:
        __import__("kernel").not_dumpable()  # the program will share our uid
    try:
        code = compile(spec["code"], "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
        report(status_fd, {"status": "syntax_error", "error": f"{type(exc).__name__}: {exc}"})
    # rlimits as root: nothing else ends the program when the checker dies (see start_sentinel)
    sentinel = spec["isolation"] == "rlimits" and spec["uid"] is not None and os.getuid() == 0
    checker_alive = start_sentinel(spec["uid"]) if sentinel else None
    to_program_r, to_program_w = os.pipe()
    from_program_r, from_program_w = os.pipe()
    fds = {
        "status": status_fd, "check": check_fd, "to_program_r": to_program_r,
        "to_program_w": to_program_w, "from_program_r": from_program_r,
        "from_program_w": from_program_w,
    }  # fmt: skip
    if checker_alive is not None:
        fds["checker_alive"] = checker_alive
    spec["harness_pid"] = os.getpid()  # the program's parent, which it must die with
    pid = os.fork()
    if pid == 0:
        try:
            program_process(spec, code, fds)
        except BaseException as exc:  # a harness failure on the program's side: say why
            sys.__excepthook__(type(exc), exc, exc.__traceback__)
        finally:
            os._exit(1)  # never back into the checker's code
    os.close(to_program_r)
    os.close(from_program_w)
    if spec["mode"] == "session":  # the cells and answers are the program's alone
        os.close(spec["reply_fd"])
        os.close(0)
    drop_privileges(spec["checker_uid"], spec["parent_pid"], spec["weak"])
    report(status_fd, check_program(spec, pid, fds))


def start_sentinel(uid: int) -> int:
    """Fork a root process that kills every process of the program's `uid` once the checker is
    gone; returns the pipe end only the checker holds (its EOF is the checker's end).

    Without a pid namespace the program would rely on a parent-death signal from its checker,
    and the kernel checks that signal against the dying checker, whose uid of its own may not
    signal the program's: a SIGKILLed trainer (which kills the checker) would leave the program
    running. The sentinel stays root, reads nothing untrusted and can be signalled by no run.
    """
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # hold no copy of the judge's pipes
                os.dup2(null, fd)
            keep = sorted({read_end, null})
            os.closerange(3, keep[0])
            os.closerange(keep[0] + 1, keep[-1])
            os.closerange(keep[-1] + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            os.read(read_end, 1)  # returns at EOF: the checker ended, normally or killed
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, 9)  # every process this uid may signal: the program's, not this one
        finally:
            os._exit(0)
    os.close(read_end)
    return write_end


def report(status_fd: int, status: dict[str, Any]) -> NoReturn:
    """The one status line, on the pipe only the checker holds; then exit."""
    data = repr(status).encode()
    while data:
        data = data[os.write(status_fd, data) :]
    os._exit(0)


def start() -> None:
    """Entry point (called by start.py)."""
    try:
        main()
    except BaseException as exc:  # the harness itself failed: the judge logs internal_error
        error = f"{type(exc).__name__}: {exc}"
        report(int(sys.argv[2]), {"status": "internal_error", "error": error})
