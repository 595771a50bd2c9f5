"""Weak-mode guard: an audit hook, plus removal of the few os functions that raise no audit
event. Used only where the kernel gives no filesystem isolation (unshare, rlimits modes).

The hook is built so that plain Python cannot switch it off: its state is immutable and lives
only in the closure (no module globals to reassign), it calls only C functions captured at
install time (no os.path helpers a program could monkeypatch), it never calls code the program
controls (a path must be an exact str/bytes/int), and it refuses the introspection that could
reach it (frames of the hook, gc, tracing, replacing a function's code). Native code or crafted
bytecode can still get past it: that is why these modes need an explicit opt-in.
"""

from __future__ import annotations

import os
import posix
import sys

TYPE_CHECKING = False  # typing costs milliseconds at every start: annotations only
if TYPE_CHECKING:
    from typing import Any

BLOCKED = frozenset(
    {
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
        "sys._current_frames", "sys.settrace", "sys.setprofile",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
        "os.chroot", "pty.spawn",
    }
)  # fmt: skip
BLOCKED_IMPORTS = frozenset(
    {
        "_ctypes", "ctypes", "_posixsubprocess", "_xxsubinterpreters", "_posixshmem",
        "_testcapi", "_testinternalcapi", "_ctypes_test", "_xxtestfuzz",
    }
)  # fmt: skip
# A frame of the hook (reached through a traceback, a generator, another thread's stack or a
# tracer) would lead to its closure. sys._getframe stays allowed (namedtuple, typing, enum use
# it): it sees only the program's and the harness's frames, which hold nothing of the guard.
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# event -> (positions of path arguments, positions of dir_fd arguments)
WRITES = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)), "os.symlink": ((1,), (2,)),
    "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
    "os.truncate": ((0,), ()), "os.chflags": ((0,), ()), "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()), "shutil.rmtree": ((0,), (1,)),
}  # fmt: skip
READS = {"os.listdir": (0,), "os.scandir": (0,), "glob.glob": (0,)}
STD_STREAMS = frozenset(
    {"/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/0", "/dev/fd/1", "/dev/fd/2"}
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# No audit event: fifos and device nodes anywhere, memory no rlimit counts, signals by pidfd.
UNAUDITED = ("mkfifo", "mknod", "memfd_create", "pidfd_open")


class SandboxViolation(PermissionError):
    """Raised by the hook; a program that lets it escape gets the verdict `blocked`."""


def remove_unaudited() -> None:
    """Take the functions that raise no audit event out of reach (os and posix share them)."""
    for name in UNAUDITED:
        for module in (os, posix):
            if hasattr(module, name):
                delattr(module, name)
    import signal

    if hasattr(signal, "pidfd_send_signal"):
        del signal.pidfd_send_signal
    for name in BLOCKED_IMPORTS:
        sys.modules.pop(name, None)  # a module loaded by the harness must be imported again


def make_hook(box: str, read_roots: tuple[str, ...]) -> Any:
    """The audit hook for a program whose only writable folder is `box`.

    Builtins and constants are bound to closure variables here: a program can reassign
    `builtins.type` or this module's globals, but not a closure it cannot reach.
    """
    # long on purpose: one closure. The hook runs inside the judged program's own process, which
    # can rebind builtins and this module's globals; the helpers (inside, resolve, check) and the
    # C functions they call live only in this scope, which the program can neither reach nor
    # replace. Split into module-level functions, they would be globals it could swap out.
    writable = (box, "/dev/null")
    readable = (*writable, *read_roots)
    blocked, blocked_imports, frame_attributes = BLOCKED, BLOCKED_IMPORTS, FRAME_ATTRIBUTES
    writes, reads, std_streams, write_flags = dict(WRITES), dict(READS), STD_STREAMS, WRITE_FLAGS
    getcwd, lstat, readlink, getpid = posix.getcwd, posix.lstat, posix.readlink, posix.getpid
    _any, _len, _type, _str, _bytes, _int = any, len, type, str, bytes, int
    violation = SandboxViolation
    no_dir_fd = (None, -1, -100)  # how the events spell "no dir_fd" (AT_FDCWD is -100)

    def inside(path: str, roots: tuple[str, ...]) -> bool:
        return _any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def resolve(raw: Any) -> str | None:
        """The real path `raw` names (symlinks followed), or None when it cannot be told."""
        if _type(raw) is _bytes:
            raw = _bytes.decode(raw, "utf-8", "surrogateescape")
        if _type(raw) is not _str or "\0" in raw:
            return None
        path = raw if raw.startswith("/") else getcwd() + "/" + raw
        todo = [p for p in path.split("/") if p and p != "."]
        done: list[str] = []
        hops = 0
        while todo:
            part = todo.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join([*done, part])
            try:
                mode = lstat(here).st_mode
            except OSError:
                done.append(part)  # missing: the rest can only be created, not followed
                continue
            if mode & 0o170000 == 0o120000:
                hops += 1
                if hops > 40:
                    return None
                target = readlink(here)
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p and p != "."] + todo
                continue
            done.append(part)
        return "/" + "/".join(done)

    def check(raw: Any, write: bool) -> None:
        if _type(raw) is _int or (_type(raw) is _str and raw in std_streams):
            return  # an already-open descriptor: nothing new is reached
        real = resolve(raw)
        if real is None or not inside(real, writable if write else readable):
            raise violation("sandbox: access to a path outside the box is not allowed")

    def absolute(raw: Any) -> bool:
        return (_type(raw) is _str and raw.startswith("/")) or (
            _type(raw) is _bytes and raw.startswith(b"/")
        )

    def hook(event: str, args: tuple[Any, ...]) -> None:
        # Every argument may be the program's object: only exact builtin types are looked at.
        if event in blocked or event.startswith("socket."):
            raise violation(f"sandbox: {event} is not allowed")
        if event == "import":
            name = args[0]
            if _type(name) is not _str or name.partition(".")[0] in blocked_imports:
                raise violation("sandbox: this import is not allowed")
        elif event in ("object.__getattr__", "object.__setattr__"):
            name = args[1]
            if _type(name) is not _str:
                raise violation("sandbox: odd attribute name")
            if name in frame_attributes or (event == "object.__setattr__" and name == "__code__"):
                raise violation("sandbox: frame introspection or code replacement is not allowed")
        elif event == "os.kill" and args[0] != getpid():
            raise violation("sandbox: signalling other processes is not allowed")
        elif event == "open":
            path, mode, flags = args[0], args[1], args[2]
            if mode is None and _type(path) is not _int and not absolute(path):
                raise violation("sandbox: os.open needs an absolute path")  # dir_fd is unseen
            text_mode = _type(mode) is _str and not _any(c in mode for c in "wax+")
            check(path, (flags & write_flags) != 0 or not (mode is None or text_mode))
        elif event in writes:
            paths, dir_fds = writes[event]
            if _any(i < _len(args) and args[i] not in no_dir_fd for i in dir_fds):
                raise violation(f"sandbox: {event} with dir_fd is not allowed")
            for i in paths:
                check(args[i], True)
        elif event in reads and args:
            path = args[reads[event][0]]
            check("." if path is None else path, False)  # os.listdir() lists the cwd

    return hook


def install(box: str, read_roots: list[str]) -> None:
    remove_unaudited()
    sys.addaudithook(make_hook(box, tuple(read_roots)))
