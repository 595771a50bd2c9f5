"""The interpreter tool's call latency and calls per second at 1, 4 and 8 calls per trajectory:
the live session (sandbox/session.py, what the tool runs) against the replay it replaced (each
call a fresh sandboxed process that first re-runs the trajectory's earlier cells).

    python benchmarks/interpreter_latency.py [--rounds 5] [--calls 1 4 8]

One trajectory = CALLS cells, each a small computation on what the earlier cells defined (what
a model's cells look like). Rounds interleave the two ways, trajectory length by trajectory
length; the figures are medians over rounds and the paired ratio replay / session per round.
Both run one trajectory at a time under the machine's strongest isolation mode; the session's
figure includes its start-up (at the first call) and its end.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gspo_cli.sandbox import Limits, SandboxSession, run_program
from gspo_cli.sandbox.isolation import detect_mode

LIMITS = Limits(time_limit_s=10.0, memory_limit_mb=512, output_limit_bytes=64 * 1024)
# cell k: uses what cell k-1 made
FIRST = "values = [i * i for i in range(2000)]\ntotal = sum(values)\ntotal"
NEXT = "values = [v % 97 + {k} for v in values]\ntotal = sum(values)\ntotal"

# The replaced design, for comparison only: earlier cells silently, then the last one.
REPLAY = """
import ast, contextlib, io
cells = {cells!r}
ns = {{"__name__": "__main__"}}
def run(source, echo):
    tree = ast.parse(source)
    last = tree.body.pop() if echo and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        print(repr(eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)))
with contextlib.redirect_stdout(io.StringIO()):
    for cell in cells[:-1]:
        run(cell, False)
run(cells[-1], True)
"""


def cells(calls: int) -> list[str]:
    return [FIRST] + [NEXT.format(k=k) for k in range(1, calls)]


Timed = tuple[list[str], float]  # each call's output, and the last call's seconds


def by_replay(trajectory: list[str]) -> Timed:
    outputs, last = [], 0.0
    for k in range(len(trajectory)):
        start = time.perf_counter()
        run = run_program(REPLAY.format(cells=trajectory[: k + 1]), limits=LIMITS)
        last = time.perf_counter() - start
        outputs.append(run.stdout.decode().strip())
    return outputs, last


def by_session(trajectory: list[str]) -> Timed:
    session = SandboxSession(LIMITS, cpu_budget_s=60)
    outputs, last = [], 0.0
    try:
        for cell in trajectory:
            start = time.perf_counter()
            outputs.append(session.run(cell).stdout.decode().strip())
            last = time.perf_counter() - start
        return outputs, last
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()
    print(f"isolation: {detect_mode()}; {args.rounds} interleaved rounds; medians")
    print(
        "| calls per trajectory | way | ms per call (start and end included) | calls/s | "
        "ms of the last call | replay / session (paired, whole trajectory) |"
    )
    print("|---|---|---|---|---|---|")
    # warm both (the harness's bytecode, the page cache); they must agree, cell by cell
    assert by_replay(cells(4))[0] == by_session(cells(4))[0]
    for calls in args.calls:
        trajectory = cells(calls)
        seconds: dict[str, list[float]] = {"replay": [], "session": []}
        lasts: dict[str, list[float]] = {"replay": [], "session": []}
        for _ in range(args.rounds):
            for way, run in (("replay", by_replay), ("session", by_session)):
                start = time.perf_counter()
                outputs, last = run(trajectory)
                seconds[way].append(time.perf_counter() - start)
                lasts[way].append(last)
                assert all(o.isdigit() for o in outputs), (way, outputs)
        ratio = statistics.median(r / s for r, s in zip(*seconds.values(), strict=True))
        for way, taken in seconds.items():
            median = statistics.median(taken)
            shown = f"{ratio:.2f}x" if way == "session" else ""
            print(
                f"| {calls} | {way} | {1000 * median / calls:.1f} | {calls / median:.1f} | "
                f"{1000 * statistics.median(lasts[way]):.1f} | {shown} |"
            )


if __name__ == "__main__":
    main()
