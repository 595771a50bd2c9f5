"""Start `gspo train` on several processes: torchrun on one node, the DeepSpeed launcher on many.

The parent checks everything a user can get wrong (recipe, run folder) before launching, so that
mistakes are one clear line rather than one traceback per rank.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from gspo_cli.errors import GspoError
from gspo_cli.recipe.schema import Recipe
from gspo_cli.run_folder import check_run_folder, run_dir_of
from gspo_cli.train.distributed import check_world_size, free_port
from gspo_cli.workers import die_with_parent, die_with_parent_argv


def under_launcher() -> bool:
    """True inside a process started by torchrun or the DeepSpeed launcher."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank_dies_with_launcher() -> None:
    """A rank ends when its launcher dies (a SIGKILLed launcher runs no cleanup)."""
    if under_launcher():
        die_with_parent(os.getppid())


def launch(
    recipe_file: Path,
    overrides: list[str],
    recipe: Recipe,
    out: Path | None,
    resume: bool,
    nproc: int,
    hostfile: Path | None,
) -> int:
    """Run the training command under a launcher; returns its exit code."""
    run_dir = run_dir_of(recipe, out)
    check_run_folder(run_dir, resume)
    check_world_size(recipe, nproc)
    args = ["train", str(recipe_file), "--out", str(run_dir)]
    args += [item for o in overrides for item in ("--set", o)]
    args += ["--resume"] if resume else []
    if hostfile is not None:
        if not hostfile.is_file():
            raise GspoError(f"--hostfile: file not found: {hostfile}")
        command = [
            "deepspeed",
            "--hostfile",
            str(hostfile),
            "--num_gpus",
            str(nproc),
            "--master_port",
            str(free_port()),
            "--module",
            "gspo_cli.cli",
            *args,
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            "gspo_cli.cli",
            *args,
        ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return run_forwarding_signals([*die_with_parent_argv(), *command], env)


def run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Run the launcher; a SIGTERM (preemption) sent to `gspo train` alone reaches it too, and
    it dies with us (setpriv). Each rank then stops at its next step boundary, saves and exits
    143 (train/signals.py). Ctrl-C reaches every process of the terminal's group by itself."""
    proc = subprocess.Popen(command, env=env)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention
