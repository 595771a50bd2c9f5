"""The sandbox: untrusted programs run under the strongest isolation the machine allows, once
each (a program run) or as a live interpreter kept between cells (a session), on a shared pool
of worker threads. Used by the code reward and by the interpreter tool; it knows nothing of
either."""

from gspo_cli.sandbox.isolation import (
    WeakIsolationError,
    allow_weak_isolation,
    available_modes,
    detect_mode,
)
from gspo_cli.sandbox.launch import Limits
from gspo_cli.sandbox.pool import SandboxPool, default_pool
from gspo_cli.sandbox.program import RunOutcome, run_program
from gspo_cli.sandbox.session import CellOutcome, SandboxSession

__all__ = [
    "CellOutcome",
    "Limits",
    "RunOutcome",
    "SandboxPool",
    "SandboxSession",
    "WeakIsolationError",
    "allow_weak_isolation",
    "available_modes",
    "default_pool",
    "detect_mode",
    "run_program",
]
