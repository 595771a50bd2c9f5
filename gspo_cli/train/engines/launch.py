"""Start `gspo train` on several processes: torchrun on one node, the DeepSpeed launcher on many
(engines/multinode.py).

The parent checks everything a user can get wrong (recipe, run folder) before launching, so that
mistakes are one clear line rather than one traceback per rank. It holds the run folder's lock
(runs/lock.py's one_writer, taken in cli.py) for all the ranks, which take none: the lock file's
descriptor is not inherited by the launcher, and the kernel drops the lock if the parent dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from gspo_cli.core.errors import Stopped
from gspo_cli.core.workers import die_with_parent, die_with_parent_argv
from gspo_cli.recipe.schema import Recipe
from gspo_cli.runs.folder import check_run_folder
from gspo_cli.train.engines.distributed import check_world_size, free_port
from gspo_cli.train.engines.multinode import (
    OVER_SSH,
    check_hosts,
    end_with_connection,
    read_hostfile,
)
from gspo_cli.train.engines.torchrun import LAUNCHER_PID

# On a stop, torchrun gives each rank trainer.stop_grace_s to reach a step boundary plus this
# long to save its checkpoint and end, before SIGKILL.
SAVE_ALLOWANCE_S = 300


SAID_BY_LAUNCHER = "GSPO_SUMMARY_SAID"  # env of the ranks `launch` starts: the summary is out


def under_launcher() -> bool:
    """True inside a process started by torchrun or the DeepSpeed launcher."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def says_summary() -> bool:
    """Whether this process prints the recipe summary: once per run, so not a rank that
    `gspo train --nproc` started (that process printed it), and under a launcher started by
    hand, rank 0 alone."""
    if not under_launcher():
        return True
    return SAID_BY_LAUNCHER not in os.environ and os.environ.get("RANK", "0") == "0"


def rank_dies_with_launcher() -> None:
    """A rank ends when its launcher dies (a SIGKILLed launcher runs no cleanup), or on
    another node, when its ssh connection to the launching node does."""
    if under_launcher():
        die_with_parent(int(os.environ.get(LAUNCHER_PID, os.getppid())))
        if OVER_SSH in os.environ:
            end_with_connection()


def launch(
    recipe_file: Path,
    overrides: list[str],
    recipe: Recipe,
    run_dir: Path,
    resume: bool,
    nproc: int,
    hostfile: Path | None,
) -> int:
    """Run the training command under a launcher; returns its exit code."""
    check_run_folder(run_dir, resume)
    hosts = read_hostfile(hostfile, nproc) if hostfile is not None else ["localhost"]
    check_world_size(recipe, nproc * len(hosts))
    args = ["train", str(recipe_file), "--out", str(run_dir)]
    args += [item for o in overrides for item in ("--set", o)]
    args += ["--resume"] if resume else []
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env[SAID_BY_LAUNCHER] = "1"
    stops = (signal.SIGINT, signal.SIGTERM)
    if hostfile is not None:
        check_hosts(hosts)
        env[OVER_SSH] = "1"
        command = _deepspeed_command(hostfile, nproc, args)
        return run_forwarding_signals(
            [*die_with_parent_argv(), *command], env, stops, own_group=True, kill_on_stop=True
        )
    command = _torchrun_command(recipe, nproc, args)
    return run_forwarding_signals([*die_with_parent_argv(), *command], env, stops, own_group=True)


def _deepspeed_command(hostfile: Path, nproc: int, args: list[str]) -> list[str]:
    """DeepSpeed's runner over ssh on the hostfile's hosts, `nproc` processes on each."""
    master_addr = os.environ.get("MASTER_ADDR")  # else DeepSpeed asks the first host
    return [
        sys.executable,
        "-m",
        "gspo_cli.train.engines.multinode",  # DeepSpeed's runner, see there
        "--hostfile",
        str(hostfile),
        "--num_gpus",  # processes per host
        str(nproc),
        *(["--master_addr", master_addr] if master_addr else []),
        "--master_port",
        os.environ.get("MASTER_PORT") or str(free_port()),
        "--force_multi",  # over ssh even with one host: it may be another machine
        "--no_ssh_check",  # check_hosts did it, on every host and with a timeout
        "--no_local_rank",
        "--module",
        "gspo_cli.cli",
        *args,
    ]


def _torchrun_command(recipe: Recipe, nproc: int, args: list[str]) -> list[str]:
    """torchrun on this node, `nproc` processes, with the ranks' time to stop."""
    return [
        sys.executable,
        "-m",
        "gspo_cli.train.engines.torchrun",  # torchrun, without a traceback on a stop
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        # The ranks' SIGTERM handling (the step boundary, the checkpoint) before SIGKILL.
        "--shutdown-timeout",
        str(int(recipe.trainer.stop_grace_s) + SAVE_ALLOWANCE_S),
        "-m",
        "gspo_cli.cli",
        *args,
    ]


def run_forwarding_signals(
    command: list[str],
    env: dict[str, str],
    signals: tuple[signal.Signals, ...],
    own_group: bool = False,
    kill_on_stop: bool = False,
) -> int:
    """Run the launcher; `signals` sent to `gspo train` alone reach it too, and it dies with us
    (setpriv). With `own_group`, the launcher has a process group of its own, so that Ctrl-C in
    a terminal (sent to our group) reaches it once, from here, like any other stop signal.

    torchrun (engines/torchrun.py) passes SIGINT or SIGTERM on to each rank as SIGTERM; the ranks
    stop at their next step boundary, with a checkpoint (train/run/signals.py), and print nothing;
    then `Stopped` is raised here, so that this process prints the one stop line and exits
    130 or 143. Without `own_group`, Ctrl-C reaches every process of the group by itself.

    With `kill_on_stop` (several nodes), a stop signal SIGKILLs the launcher instead: the ranks
    end at once with their ssh connections (multinode.py), with no checkpoint of their own, and
    DeepSpeed's own stop, a `pkill -f` of every DeepSpeed launcher on every host, is not run."""
    proc = subprocess.Popen(command, env=env, process_group=0 if own_group else None)
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL if kill_on_stop else signum)

    previous = {signum: signal.signal(signum, forward) for signum in signals}
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    if kill_on_stop and forwarded:
        raise Stopped(forwarded[0])
    if code - 128 in forwarded:  # the launcher stopped on our signal (not a rank's failure)
        raise Stopped(code - 128)
    return code
