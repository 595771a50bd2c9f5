"""Code-sandbox throughput: programs judged per second, and the cost of the sandbox per program.

    python benchmarks/sandbox_throughput.py [--programs 40] [--workers N] [--isolation MODE]

The overhead is the mean time of one sandboxed run of an empty program against one bare
`python -c pass` of the same interpreter, both run one after the other: in wall time, and in
CPU time (this process and every descendant, through a cpu-accounting cgroup where one can be
made) which a machine shared with other work does not distort.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gspo_cli.rewards.code import judge_completions
from gspo_cli.sandbox import SandboxPool, run_program
from gspo_cli.sandbox.cgroups import ROOT, own_cgroup_paths
from gspo_cli.sandbox.isolation import child_python, detect_mode

PROGRAM = "```python\nn = int(input())\nprint(sum(range(n)))\n```"
TESTS = {"inputs": ["1000\n"], "outputs": ["499500\n"]}


@contextmanager
def cpu_meter() -> Iterator[Callable[[], float] | None]:
    """Milliseconds of CPU used so far by this process and its descendants, or None where no
    cgroup can be made (rusage would miss processes reaped inside the sandbox). This process
    moves into a child of its own cgroup for the measurement, and back."""
    paths = own_cgroup_paths()
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    key = "" if v2 else next((k for k in paths if "cpuacct" in k.split(",")), None)
    mount = ROOT if v2 else ROOT / str(key)
    if key is None or not mount.exists():
        yield None
        return
    home = mount / paths[key].lstrip("/")
    group = home / f"gspo-bench-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        with suppress(OSError):
            group.rmdir()
        yield None
        return

    def used_ms() -> float:
        if v2:
            stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1000
        return int((group / "cpuacct.usage").read_text()) / 1e6

    try:
        yield used_ms
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(100):
            with suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.01)


def mean_cost(fn: Callable[[], object], repeats: int, cpu: Callable[[], float] | None) -> str:
    """Mean wall (and CPU) milliseconds of `repeats` calls of fn() after one warm-up call."""
    fn()
    cpu_start, start = cpu() if cpu else 0.0, time.perf_counter()
    for _ in range(repeats):
        fn()
    wall = (time.perf_counter() - start) * 1000 / repeats
    if cpu is None:
        return f"{wall:.1f} ms wall"
    return f"{wall:.1f} ms wall, {(cpu() - cpu_start) / repeats:.1f} ms CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--isolation", choices=("bwrap", "unshare", "rlimits"), default=None)
    args = parser.parse_args()
    mode = args.isolation or detect_mode()
    weak = {"allow_weak_isolation": mode != "bwrap"}  # asked for by name: these are our programs
    python = child_python()

    with cpu_meter() as cpu:
        bare = mean_cost(lambda: subprocess.run([python, "-c", "pass"], check=True), 20, cpu)
        boxed = mean_cost(lambda: run_program("pass", isolation=mode, **weak), 20, cpu)
    pool = SandboxPool(args.workers)
    try:
        judge_completions([PROGRAM], [TESTS], pool=pool, isolation=mode, **weak)  # warm-up
        start = time.perf_counter()
        results = judge_completions(
            [PROGRAM] * args.programs, [TESTS] * args.programs, pool=pool, isolation=mode, **weak
        )
        elapsed = time.perf_counter() - start
    finally:
        pool.close()
    accepted = sum(r.verdict == "accepted" for r in results)

    print(f"isolation mode       : {mode}   interpreter: {python}")
    print(f"workers              : {args.workers}   cpus: {os.cpu_count()}")
    print(f"programs judged      : {args.programs} ({accepted} accepted) in {elapsed:.2f} s")
    print(f"throughput           : {args.programs / elapsed:.1f} programs/s")
    print(f"bare `python -c pass`: {bare}")
    print(f"sandboxed empty run  : {boxed}")
    print(f"load average         : {os.getloadavg()[0]:.2f} (other work on the machine)")
    if accepted != args.programs:
        raise SystemExit("some programs were not accepted: the sandbox is misbehaving")


if __name__ == "__main__":
    main()
