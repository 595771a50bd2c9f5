"""The parent: one process per side, interleaved rounds, then the report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from .report import describe, report
from .shapes import SHAPES

PACKAGE = Path(__file__).resolve().parent


class Side:
    def __init__(self, name: str, shape: str, workload: str, cycles: int, logs: str) -> None:
        self.name = name
        self.log_path = os.path.join(logs, f"{shape}-{workload}-{name}.log")
        self.log = open(self.log_path, "w")  # noqa: SIM115 - open for the process's life
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, str(PACKAGE), "--worker", name]  # runs __main__.py
        self.proc = subprocess.Popen(
            [*command, "--shapes", shape, "--workload", workload, "--cycles", str(cycles)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.log.flush()
            with open(self.log_path) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"{self.name} died (log {self.log_path}):\n{tail}")
        return dict(json.loads(line))

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.receive()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def measure(
    name: str, workload: str, sides: list[str], rounds: int, console: Console, logs: str
) -> None:
    shape = SHAPES[name]
    about = describe(shape, workload)
    console.rule(f"shape {name}, {workload} workload: {about}; {rounds} round(s) after a warm-up")
    started = time.perf_counter()
    procs = {s: Side(s, name, workload, rounds + 1, logs) for s in sides}
    try:
        params = {s: p.receive()["parameters"] for s, p in procs.items()}
        console.print(f"{params[sides[0]] / 1e6:.1f}M parameters; sides: {', '.join(sides)}")
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for r in range(rounds + 1):  # round 0 warms up
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            done = {s: procs[s].go() for s in order}
            for s in sides if r else ():
                results[s].append(done[s])
            seconds = ", ".join(f"{s} {done[s]['seconds']:.2f}s" for s in order)
            console.print(f"{f'round {r}' if r else 'warm-up'}: {seconds}", highlight=False)
        peaks = {s: p.go()["peak_rss_mb"] for s, p in procs.items()}
    finally:
        for p in procs.values():
            p.close()
    report(name, shape, workload, sides, results, peaks, rounds, console)
    console.print(f"shape {name}, {workload} workload, took {time.perf_counter() - started:.0f}s")
