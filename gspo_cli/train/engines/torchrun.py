"""torchrun that stops quietly: `python -m gspo_cli.train.engines.torchrun ARGS` runs
`torchrun ARGS`.

`gspo train --nproc N` starts this in a process group of its own and forwards SIGINT and
SIGTERM to it (train/engines/launch.py), so that each stop signal reaches it exactly once.

torchrun's own handler for them (torch.distributed.elastic.multiprocessing.api) raises
SignalException in its main thread; its agent then shuts the ranks down (the signal to each
rank's process group, SIGKILL after --shutdown-timeout) and re-raises it, so torchrun ends with
a traceback and warnings about the shutdown. Here our own handler raises that exception
(torchrun is told to leave SIGINT and SIGTERM alone, `--signals-to-handle`), so the shutdown
stays torchrun's, but:

- the ranks get SIGTERM, Ctrl-C included: they stop together at a step boundary, with one
  checkpoint (train/run/signals.py). A KeyboardInterrupt would hit each rank at another point
  (in a collective, in a `__del__` that swallows it, while Python is still importing), so some
  ranks would print tracebacks and others would not stop at all. A second signal, which
  torchrun passes on as SIGTERM too, stops them at once;
- its warnings are silenced, and it ends with exit 128 + N (N: the first signal, so 130 for
  Ctrl-C): the launching `gspo train` prints the one stop line.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# torchrun's default list (SIGTERM,SIGINT,SIGHUP,SIGQUIT) less ours: those keep its handler.
TORCHRUN_SIGNALS = "SIGHUP,SIGQUIT"
# This process's pid, for the ranks: each one dies with it (launch.py), even a rank that
# starts after it has died (its parent is then another process).
LAUNCHER_PID = "GSPO_LAUNCHER_PID"

_received: list[int] = []  # the stop signals, in order


def _exit(signum: int, frame: FrameType | None) -> None:
    """A stop before torchrun has started any rank: nothing to shut down."""
    raise SystemExit(128 + signum)


def _stop(signum: int, frame: FrameType | None) -> None:
    from torch.distributed.elastic.multiprocessing import SignalException

    _received.append(signum)
    # "Received SIGTERM death signal, shutting down workers", "Sending process N closing
    # signal SIGTERM": the stop line says it. Errors (a rank that will not end) still show.
    logging.disable(logging.WARNING)
    raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.SIGTERM)


def main(argv: list[str]) -> int:
    for signum in STOP_SIGNALS:  # first thing: a stop during torch's import is not lost
        signal.signal(signum, _exit)
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.run import main as torchrun

    os.environ[LAUNCHER_PID] = str(os.getpid())
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop)
    try:
        torchrun(["--signals-to-handle", TORCHRUN_SIGNALS, *argv])
    except SignalException:
        return 128 + _received[0]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
