"""Code-sandbox throughput: programs judged per second, and the cost of the sandbox per program.

    python benchmarks/sandbox_throughput.py [--programs 40] [--workers N] [--isolation MODE]

The overhead is the mean time of one sandboxed run of an empty program minus one bare
`python -c pass` of the same interpreter, both run one after the other.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable

from gspo_cli.rewards.code import JudgePool, judge_completions, run_program
from gspo_cli.rewards.code.isolation import child_python, detect_mode

PROGRAM = "```python\nn = int(input())\nprint(sum(range(n)))\n```"
TESTS = {"inputs": ["1000\n"], "outputs": ["499500\n"]}


def mean_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Mean wall time of `repeats` calls of fn() after one warm-up call."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--isolation", choices=("bwrap", "unshare", "rlimits"), default=None)
    args = parser.parse_args()
    mode = args.isolation or detect_mode()
    python = child_python()

    bare = mean_seconds(lambda: subprocess.run([python, "-c", "pass"], check=True), 20)
    boxed = mean_seconds(lambda: run_program("pass", isolation=mode), 20)

    pool = JudgePool(args.workers)
    try:
        judge_completions([PROGRAM], [TESTS], pool=pool, isolation=mode)  # warm-up
        start = time.perf_counter()
        results = judge_completions(
            [PROGRAM] * args.programs, [TESTS] * args.programs, pool=pool, isolation=mode
        )
        elapsed = time.perf_counter() - start
    finally:
        pool.close()
    accepted = sum(r.verdict == "accepted" for r in results)

    print(f"isolation mode       : {mode}   interpreter: {python}")
    print(f"workers              : {args.workers}   cpus: {os.cpu_count()}")
    print(f"programs judged      : {args.programs} ({accepted} accepted) in {elapsed:.2f} s")
    print(f"throughput           : {args.programs / elapsed:.1f} programs/s")
    print(f"bare `python -c pass`: {bare * 1000:.1f} ms")
    print(f"sandboxed empty run  : {boxed * 1000:.1f} ms")
    print(f"sandbox overhead     : {(boxed - bare) * 1000:.1f} ms per program")
    if accepted != args.programs:
        raise SystemExit("some programs were not accepted: the sandbox is misbehaving")


if __name__ == "__main__":
    main()
