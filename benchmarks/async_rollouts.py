"""Asynchronous rollouts on the quickstart: rollout.max_staleness 0 (synchronous) vs 1 vs 2.

Each round trains the quickstart (100 RL steps, held-out accuracy every 25 on 200 problems x 4
samples) once per N, in an order rotated round by round, one run at a time, from one cold
start per round (its seed). Threads: the synchronous run gets both cores' worth (2 torch
threads); an asynchronous run gets one for training and one for its rollout worker
(rollout.worker_threads 1), so every run uses the same two cores.

    .venv/bin/python benchmarks/async_rollouts.py DIR [--rounds 2] [--staleness 0,1,2]
        [--steps 100]

Wall time is `time_elapsed_s`, the run's own clock from its first RL step: held-out evals and
checkpoints are in it for every N alike (a worker keeps sampling while the trainer evaluates,
as it would in any run). Per run it prints steps per hour, held-out accuracy at each eval,
and the wall time at which the run first reached the synchronous run's final accuracy of the
same round (linear between evals); per N the speed-up to that accuracy against N = 0, paired
by round, and the accuracy differences at equal steps against the noise of 200 x 4 samples
(two binomial standard errors). A finished run (summary.json) is not run again, so an
interrupted benchmark picks up where it stopped. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gspo_cli.run_folder import COLD_START, EVALS, HF_CONFIG, METRICS

QUICKSTART = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"
GSPO = [sys.executable, "-m", "gspo_cli.cli"]
SAMPLES = 200 * 4  # held-out problems x samples: the quickstart's eval


def _gspo(command: str, folder: Path, threads: int, *sets: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    args = [*GSPO, command, str(QUICKSTART), "--out", str(folder), "--set", "logging.console=plain"]
    for setting in sets:
        args += ["--set", setting]
    log = folder.parent / f"{folder.name}.log"
    with log.open("w") as handle:
        if command == "train":  # the run finds the cold start copied into its folder
            args.append("--resume")
        done = subprocess.run(args, stdout=handle, stderr=subprocess.STDOUT, env=env)
    print(f"{folder.name}: exit {done.returncode} ({log})", flush=True)


def _cold_start(seed: int, out: Path) -> Path:
    folder = out / f"cold-start-s{seed}"
    if not (folder / COLD_START / HF_CONFIG).exists():
        _gspo("sft", folder, 2, f"trainer.seed={seed}")
    return folder / COLD_START


def _train(staleness: int, seed: int, steps: int, out: Path) -> Path:
    folder = out / f"n{staleness}-s{seed}"
    if not (folder / "summary.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copytree(_cold_start(seed, out), folder / COLD_START, dirs_exist_ok=True)
        sets = [f"trainer.seed={seed}", f"trainer.steps={steps}", f"name={folder.name}"]
        if staleness:
            sets += [f"rollout.max_staleness={staleness}", "rollout.worker_threads=1"]
        _gspo("train", folder, 1 if staleness else 2, *sets)
    return folder


def _curve(folder: Path) -> list[tuple[int, float, float]]:
    """(step, wall time in s, held-out accuracy) at each eval after step 0."""
    wall = {
        rec["step"]: rec["time_elapsed_s"]
        for rec in map(json.loads, (folder / METRICS).read_text().splitlines())
    }
    evals = [json.loads(line) for line in (folder / EVALS).read_text().splitlines()]
    return [(e["step"], wall[e["step"]], e["accuracy"]) for e in evals if e["step"] in wall]


def _time_to(curve: list[tuple[int, float, float]], target: float) -> float | None:
    """The wall time at which the curve first reaches `target` (linear between evals)."""
    previous = (0.0, -math.inf)
    for _, wall, accuracy in curve:
        if accuracy >= target:
            t0, a0 = previous
            if a0 == -math.inf:
                return wall
            return t0 + (wall - t0) * (target - a0) / (accuracy - a0)
        previous = (wall, accuracy)
    return None


def report(curves: dict[tuple[int, int], list[tuple[int, float, float]]], seeds: list[int]) -> str:
    lines = [
        "| N | round | steps/hour | held-out accuracy at each eval | reaches N=0's final at |",
        "|---|---|---|---|---|",
    ]
    speedups: dict[int, list[float]] = {}
    gaps: dict[int, list[float]] = {}
    for (staleness, seed), curve in sorted(curves.items()):
        base = curves.get((0, seed))
        if not curve or not base:
            continue
        target = base[-1][2]
        reached = _time_to(curve, target)
        step, wall, _ = curve[-1]
        accuracies = " ".join(f"{a:.1%}@{s}" for s, _, a in curve)
        when = "not reached" if reached is None else f"{reached:.0f}s"
        lines.append(f"| {staleness} | {seed} | {3600 * step / wall:.0f} | {accuracies} | {when} |")
        base_time = _time_to(base, target)
        if staleness and reached and base_time:
            speedups.setdefault(staleness, []).append(base_time / reached)
        if staleness:
            gaps.setdefault(staleness, []).extend(
                a - b for (_, _, a), (_, _, b) in zip(curve, base, strict=False)
            )
    lines.append("")
    for staleness in sorted(set(speedups) | set(gaps)):
        ratios = speedups.get(staleness, [])
        shown = ", ".join(f"{r:.2f}x" for r in ratios) or "never reached"
        mean_gap = sum(gaps[staleness]) / max(1, len(gaps[staleness]))
        noise = 2 * math.sqrt(0.25 / SAMPLES) * math.sqrt(2)  # two SE of a difference, at p=0.5
        lines.append(
            f"N={staleness}: to the synchronous run's final accuracy {shown} sooner (per round); "
            f"accuracy at equal steps {mean_gap:+.1%} on average against N=0 "
            f"(noise: +-{noise:.1%})"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--staleness", default="0,1,2")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    values = [int(v) for v in args.staleness.split(",")]
    if 0 not in values:
        raise SystemExit("--staleness must include 0, the synchronous baseline")
    seeds = list(range(1, args.rounds + 1))
    curves = {}
    for round_index, seed in enumerate(seeds):
        order = values[round_index % len(values) :] + values[: round_index % len(values)]
        for staleness in order:  # interleaved: each N runs first in some round
            folder = _train(staleness, seed, args.steps, args.out)
            if (folder / "summary.json").exists():
                curves[staleness, seed] = _curve(folder)
    table = report(curves, seeds)
    (args.out / "async_rollouts.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
