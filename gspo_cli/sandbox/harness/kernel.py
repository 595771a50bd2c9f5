"""System calls Python does not wrap, through ctypes: prctl, mount and a seccomp filter.

Loaded by the harness only where needed (weak modes, or a non-root checker), and dropped from
sys.modules before the program runs (the guard refuses importing ctypes again).
"""

from __future__ import annotations

import ctypes
import os
import struct

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
MS_NOSUID, MS_NODEV = 2, 4
RET_ALLOW, RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
RET_EPERM = 0x00050000 | 1
# audit arch, then socket, socketpair, ptrace, process_vm_readv, process_vm_writev, io_uring_setup
ARCHES = {
    "x86_64": (0xC000003E, (41, 53, 101, 310, 311, 425)),
    "aarch64": (0xC00000B7, (198, 199, 117, 270, 271, 425)),
}
X32_BIT = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, value: int, arg3: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(arg3), 0, 0), "prctl")


def no_new_privs() -> None:
    """setuid/setgid/file-capability binaries can no longer raise anyone's privileges."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def not_dumpable() -> None:
    """Processes of the same uid can no longer ptrace us or open our /proc files (fds, mem)."""
    prctl(PR_SET_DUMPABLE, 0)


def mount_tmpfs(target: str, size_bytes: int, mode: int) -> None:
    """A fresh size-limited tmpfs on `target` (needs a private mount namespace)."""
    options = f"size={size_bytes},mode={mode:o}".encode()
    flags = MS_NOSUID | MS_NODEV
    result = _libc.mount(b"tmpfs", target.encode(), b"tmpfs", ctypes.c_ulong(flags), options)
    _check(result, f"mount {target}")


def deny_sockets_and_tracing() -> bool:
    """A seccomp filter: socket creation, ptrace, cross-process memory access and io_uring fail
    with EPERM, and foreign-ABI system calls kill. Needs no_new_privs. False on unknown arches.
    """
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        return False
    audit_arch, denied = arch
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    code = [(ld_abs, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, RET_KILL_PROCESS)]
    code.append((ld_abs, 0, 0, 0))
    deny_at = len(code) + len(denied) + 2  # after the checks and the x32 test and the allow
    code.append((jge, deny_at - len(code) - 1, 0, X32_BIT))
    for number in denied:
        code.append((jeq, deny_at - len(code) - 1, 0, number))
    code += [(ret, 0, 0, RET_ALLOW), (ret, 0, 0, RET_EPERM)]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class Program(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    program = Program(len(code), ctypes.addressof(buffer))
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(program))
    return True


def die_with_parent(parent: int | None) -> None:
    """SIGKILL when `parent` dies. Changing uid (and fork) clears this, so it is asked for
    again after dropping privileges: a killed trainer leaves no program running. A parent that
    died before the request can signal no more (we were reparented): then exit now."""
    prctl(PR_SET_PDEATHSIG, 9)
    if parent is not None and os.getppid() != parent:
        os._exit(137)
