"""Several nodes: `gspo train --hostfile FILE` runs DeepSpeed's launcher (its pdsh runner), which
starts `deepspeed.launcher.launch` on every host over ssh, which starts the ranks there.

The launching `gspo train` reads the hostfile and checks each host over ssh first (one line per
mistake, a bounded wait), then runs `python -m gspo_cli.train.engines.multinode ARGS`: DeepSpeed's
runner (`deepspeed ARGS`) with what gspo adds around it:

- the remote ranks get gspo's environment: DeepSpeed exports to them only the variables whose
  names start with PYTHON, MLFLOW, MV2, UCX (NCCL too on CUDA) and those in `.deepspeed_env`;
  here GSPO_*, OMP_* and GLOO_* as well (GSPO_SUMMARY_SAID, OMP_NUM_THREADS, GLOO_SOCKET_IFNAME);
- nothing outlives a SIGKILLed `gspo train`: this process dies with it (setpriv), pdsh and its
  ssh clients with this process (a watchdog ends its process group), and each remote rank with
  its ssh connection (`end_with_connection`: its stdin, a pipe from sshd, reaches its end).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

from gspo_cli.core.errors import GspoError
from gspo_cli.core.workers import kill_group_when_gone

OVER_SSH = "GSPO_OVER_SSH"  # env of the ranks started this way: they end with their connection
EXPORTED = ["GSPO_", "OMP_", "GLOO_"]  # besides DeepSpeed's own prefixes
SSH_TIMEOUT_S = 10  # to connect to a host, as pdsh's own default (-t 10)
HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")  # DeepSpeed's own pattern: `worker-1 slots=4`
SAME_PATHS = "every node needs the project and its venv at the same paths as here"


def read_hostfile(path: Path, nproc: int) -> list[str]:
    """The hosts, in order (the first one runs global rank 0); each must offer `nproc` slots."""
    if not path.is_file():
        raise GspoError(f"--hostfile: file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GspoError(
            f"{path}: not UTF-8 text (byte {exc.start}); a hostfile is `HOST slots=N` lines"
        ) from None
    hosts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = HOST_LINE.match(line)
        if match is None:
            raise GspoError(f"{path}:{number}: expected `HOST slots=N`, got {line!r}")
        host, slots = match[1], int(match[2])
        if host in hosts:
            raise GspoError(f"{path}:{number}: {host} is listed twice")
        if slots < nproc:
            raise GspoError(f"{path}:{number}: --nproc {nproc} but {host} has slots={slots}")
        hosts[host] = slots
    if not hosts:
        raise GspoError(f"{path}: no hosts (one `HOST slots=N` line per node)")
    return list(hosts)


def check_hosts(hosts: list[str]) -> None:
    """Each host answers ssh without a password, and has this project folder and this Python
    at the same paths (the ranks `cd` there and run it); else one line, within a bounded time."""
    if shutil.which("pdsh") is None:
        raise GspoError("--hostfile needs pdsh, DeepSpeed's ssh launcher (apt install pdsh)")
    if shutil.which("ssh") is None:
        raise GspoError("--hostfile needs ssh (apt install openssh-client)")
    cwd, python = shlex.quote(os.getcwd()), shlex.quote(sys.executable)
    probe = f"test -d {cwd} || exit 101; test -x {python} || exit 102"
    options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}"]
    probes = {
        host: subprocess.Popen(
            ["ssh", *options, host, probe],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host in hosts
    }
    try:
        for host, proc in probes.items():
            try:
                _, err = proc.communicate(timeout=3 * SSH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise GspoError(
                    f"--hostfile: {host} did not answer ssh in {3 * SSH_TIMEOUT_S} s"
                ) from None
            if proc.returncode == 101:
                raise GspoError(f"--hostfile: {host} has no folder {os.getcwd()}: {SAME_PATHS}")
            if proc.returncode == 102:
                raise GspoError(f"--hostfile: {host} has no {sys.executable}: {SAME_PATHS}")
            if proc.returncode != 0:
                said = (err.strip().splitlines() or [f"ssh exit code {proc.returncode}"])[-1]
                raise GspoError(
                    f"--hostfile: cannot reach {host} by ssh without a password: {said}"
                )
    finally:
        for proc in probes.values():
            proc.kill()
            proc.wait()


def end_with_connection() -> None:
    """In a rank started over ssh: SIGKILL this process once its stdin, the ssh channel from the
    launching node, ends (the launcher died or the connection dropped). Nothing is ever sent on
    it. Its children die with it (parent-death signals), and DeepSpeed's launcher on this node
    then ends the node's other ranks."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:  # no stdin at all
        return
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):  # sshd gives a pipe; else no watch
        return

    def watch() -> None:
        while os.read(0, 1 << 16):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-ssh", daemon=True).start()


def main(argv: list[str]) -> int:
    kill_group_when_gone(tag=False)  # this process leads its group (launch.py starts it so)
    from deepspeed.launcher import runner

    runner.EXPORT_ENVS.extend(EXPORTED)  # read when main() builds the exports
    runner.main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
