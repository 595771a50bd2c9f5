"""The tables and the checks: seconds, tokens/s, peak RSS, paired ratios, the calls of the
equal-work sides, the lengths and the groups without signal."""

from __future__ import annotations

import platform
import statistics
from typing import Any

import torch
from cycle import MINIBATCHES, PROMPTS, SAMPLES
from realistic_workload import AT_CAP, CAP, MEDIAN, MIN_LENGTH, SIGMA, no_signal_groups
from rich.console import Console
from rich.table import Table

from .shapes import Shape
from .workloads import expected_lengths

EQUAL_WORK = ("gspo", "trl", "floor")
BASES = ("trl", "floor")  # the ratio columns
LABELS = {
    "gspo": "gspo-cli",
    "gspo-defaults": "gspo-cli, defaults (not equal work)",
    "trl": "TRL GRPOTrainer",
    "floor": "floor (plain torch)",
}
REALISTIC_LABELS = {
    **LABELS,
    "gspo-defaults": "gspo-cli, defaults (LESS work: no-signal rows skipped, prompts run once)",
}


def _ratio(values: list[float], base: list[float]) -> str:
    """The median of the paired (same round) ratios."""
    return f"{statistics.median(a / b for a, b in zip(values, base, strict=True)):.2f}x"


def _calls(c: dict[str, int], tokens: bool = True, steps: bool = True) -> str:
    """generate/forward/backward/step counts, with forwarded tokens and decode steps."""
    keys = ("generate", "forward", "backward", "optimizer.step")
    counts = "/".join(str(c.get(k, 0)) for k in keys)
    forwarded = f"{c.get('forward tokens', 0)}; " if tokens else ""
    return f"{counts} ({forwarded}{c.get('decode steps', 0) if steps else '-'})"


def describe(shape: Shape, workload: str) -> str:
    if workload == "fixed":
        return f"{shape.about}, L={shape.length}"
    if workload == "quickstart":
        return (
            f"{shape.about} after the quickstart's cold start, its prompts and maths verifier, "
            f"lengths as sampled (at most {CAP})"
        )
    return (
        f"{shape.about}, realistic lengths: lognormal median {MEDIAN} sigma {SIGMA} "
        f"in [{MIN_LENGTH}, {CAP - 1}] + {AT_CAP} rows at cap {CAP}"
    )


def report(
    name: str,
    shape: Shape,
    workload: str,
    sides: list[str],
    results: dict[str, list[dict[str, Any]]],
    peaks: dict[str, float],
    rounds: int,
    console: Console,
) -> None:
    seconds = {s: [x["seconds"] for x in results[s]] for s in sides}
    title = (
        f"{name} ({describe(shape, workload)}), {PROMPTS}x{SAMPLES} responses, {MINIBATCHES} "
        f"updates; median of {rounds} interleaved round(s); torch {torch.__version__}, 1 thread "
        f"per side, {platform.processor() or platform.machine()}"
    )
    labels = LABELS if workload == "fixed" else REALISTIC_LABELS
    table = Table(title=title)
    columns = ["side", "s/cycle", "completion tok/s", "peak RSS MB", "vs TRL", "vs floor"]
    for col in [*columns, "calls: generate/forward/backward/step (forward tokens; decode steps)"]:
        table.add_column(col, justify="right")
    for s in sides:
        median = statistics.median(seconds[s])
        tokens = statistics.median(x["tokens"] for x in results[s])
        ratios = [_ratio(seconds[s], seconds[base]) if base in sides else "-" for base in BASES]
        calls = {_calls(x["calls"]) for x in results[s]}
        table.add_row(
            labels[s],
            f"{median:.3f}",
            f"{tokens / median:.0f}",
            f"{peaks[s]:.0f}",
            *ratios,
            " | ".join(sorted(calls)),
        )
    console.print(table)
    if workload == "quickstart":
        _print_sampled(sides, results, console)
    else:
        _check_lengths(shape, workload, sides, results, console)
    _check_calls(workload, sides, results, console)
    if workload != "fixed":
        _print_no_signal(workload, sides, results, console)


def _check_lengths(
    shape: Shape,
    workload: str,
    sides: list[str],
    results: dict[str, list[dict[str, Any]]],
    console: Console,
) -> None:
    """Every side's rows of cycle c (round c) have exactly the lengths asked for."""
    expected = [
        expected_lengths(shape, workload, cycle) for cycle in range(1, len(results[sides[0]]) + 1)
    ]
    wrong = [
        s
        for s in sides
        if [x["lengths"] for x in results[s]] != expected
        or [x["tokens"] for x in results[s]] != [sum(e) for e in expected]
    ]
    totals = ", ".join(str(sum(e)) for e in expected)
    if wrong:
        console.print(f"[bold red]!!! completion lengths differ from those asked for: {wrong}[/]")
    else:
        console.print(f"completion lengths as asked on every side; tokens per cycle: {totals}")
    if workload == "realistic":
        for cycle, lengths in enumerate(expected, 1):
            below = [n for n in lengths if n < CAP]
            console.print(
                f"cycle {cycle}: mean length {statistics.mean(lengths):.1f}, median "
                f"{statistics.median(lengths)}, longest below the cap {max(below)}, "
                f"{len(lengths) - len(below)} at the cap {CAP}",
                highlight=False,
            )


def _check_calls(
    workload: str, sides: list[str], results: dict[str, list[dict[str, Any]]], console: Console
) -> None:
    """The equal-work sides make the same calls. With uneven lengths the forwarded tokens
    legitimately differ (padding to the batch's longest vs each micro-batch's): printed only;
    so do the decode steps where each side samples its own lengths (quickstart)."""
    tokens, steps = workload == "fixed", workload != "quickstart"
    per_side = {
        s: {_calls(x["calls"], tokens, steps) for x in results[s]} for s in sides if s in EQUAL_WORK
    }
    if len({frozenset(v) for v in per_side.values()}) > 1 or any(
        len(v) > 1 for v in per_side.values()
    ):
        console.print(f"[bold red]!!! THE EQUAL-WORK SIDES MADE DIFFERENT CALLS: {per_side}[/]")
    else:
        console.print(f"calls equal on {', '.join(per_side)}: {next(iter(per_side.values()))}")
    if not tokens:
        forwarded = ", ".join(
            f"{s} {'/'.join(str(x['calls'].get('forward tokens', 0)) for x in results[s])}"
            for s in sides
        )
        console.print(f"forward tokens per cycle (information): {forwarded}", highlight=False)
    decoded = ", ".join(
        f"{s} {'/'.join(str(x['calls'].get('decoded rows', 0)) for x in results[s])}" for s in sides
    )
    console.print(
        f"rows computed over all decode steps per cycle (information; gspo-cli drops a row at "
        f"its end-of-turn, `generate` computes every row to the longest): {decoded}",
        highlight=False,
    )


def _print_sampled(
    sides: list[str], results: dict[str, list[dict[str, Any]]], console: Console
) -> None:
    """Each side samples its own responses (quickstart): their lengths, per cycle."""
    for s in sides:
        cycles = [x["lengths"] for x in results[s]]
        stats = ", ".join(f"mean {statistics.mean(c):.1f} max {max(c)}" for c in cycles)
        console.print(f"sampled lengths per cycle, {s}: {stats}", highlight=False)


def _print_no_signal(
    workload: str, sides: list[str], results: dict[str, list[dict[str, Any]]], console: Console
) -> None:
    """The share of groups that scored all equal, as each side measured it, per cycle (and,
    where they were drawn, a flag if they are not the drawn ones)."""
    drawn = [no_signal_groups(cycle) for cycle in range(1, len(results[sides[0]]) + 1)]
    for s in sides:
        measured = [x["no_signal"] for x in results[s]]
        shares = ", ".join(f"{n}/{PROMPTS}" for n in measured)
        wrong = workload == "realistic" and measured != drawn
        flag = " [bold red]!!! not as drawn[/]" if wrong else ""
        console.print(f"no-signal groups per cycle, {s}: {shares}{flag}")
