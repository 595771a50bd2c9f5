"""The sandbox: untrusted programs run one at a time under the strongest isolation the machine
allows, on a shared pool of worker threads. Used by the code reward and by the interpreter tool;
it knows nothing of either."""

from gspo_cli.sandbox.isolation import (
    WeakIsolationError,
    allow_weak_isolation,
    available_modes,
    detect_mode,
)
from gspo_cli.sandbox.pool import SandboxPool, default_pool
from gspo_cli.sandbox.program import Limits, RunOutcome, run_program

__all__ = [
    "Limits",
    "RunOutcome",
    "SandboxPool",
    "WeakIsolationError",
    "allow_weak_isolation",
    "available_modes",
    "default_pool",
    "detect_mode",
    "run_program",
]
