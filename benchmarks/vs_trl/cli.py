"""The options: the parent's (shapes, rounds, sides, workloads) and a worker's."""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

import quickstart_workload
from rich.console import Console

from . import __doc__ as ABOUT
from .rounds import measure
from .shapes import DEFAULT_SHAPES, SHAPES
from .worker import SIDES, worker
from .workloads import WORKLOADS


def main() -> None:
    parser = argparse.ArgumentParser(description=ABOUT.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"comma-separated, of {', '.join(SHAPES)} (default: {', '.join(DEFAULT_SHAPES)})",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated")
    parser.add_argument(
        "--workload",
        default="fixed",
        help="fixed, realistic, quickstart (tiny-dense only), comma-separated",
    )
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, SHAPES[args.shapes], args.workload, args.cycles)
        return
    console = Console(width=160)
    workloads = [w for w in args.workload.split(",") if w]
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"unknown workload(s) {sorted(unknown)}: choose from {WORKLOADS}")
    sides = [s for s in args.sides.split(",") if s]
    if "trl" in sides and importlib.util.find_spec("trl") is None:
        console.print(
            "[bold red]TRL is not installed here: `make bench-trl` runs this script in "
            ".venv-trl; going on without the TRL side[/]"
        )
        sides.remove("trl")
    if os.environ.get("OMP_NUM_THREADS") != "1":
        console.print("note: the sides run with OMP_NUM_THREADS=1 whatever this shell says")
    with tempfile.TemporaryDirectory(prefix="vs_trl-") as logs:
        if "quickstart" in workloads:
            console.rule("the quickstart's cold start (gspo sft recipes/quickstart.yaml)")
            os.environ[quickstart_workload.MODEL_ENV] = quickstart_workload.cold_start(logs)
        for workload in workloads:
            for name in args.shapes.split(","):
                if workload == "quickstart" and name != "tiny-dense":
                    console.print(f"the quickstart workload is tiny-dense's: {name} left out")
                    continue
                measure(name, workload, sides, args.rounds, console, logs)
