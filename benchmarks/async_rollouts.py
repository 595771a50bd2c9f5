"""Asynchronous rollouts on the quickstart: rollout.max_staleness 0 (synchronous) vs 1 vs 2.

Each round trains the quickstart (100 RL steps, held-out accuracy every 25 on 200 problems x 4
samples) once per N, in an order rotated round by round, one run at a time, from one cold
start per round (its seed). Threads: the synchronous run gets both cores' worth (2 torch
threads); an asynchronous run gets one for training and one for its rollout worker
(rollout.worker_threads 1), so every run uses the same two cores. `--one-thread-sync` adds
N = 0 on one thread: what overlapping buys at equal threads per process, which is not the
comparison the target is for. `--corrected` adds N = 1 with pi_old recomputed on the current
weights and a sequence-level correction towards the sampling policy (`seq_truncate`).

    .venv/bin/python benchmarks/async_rollouts.py DIR [--rounds 2] [--staleness 1,2]
        [--steps 100] [--one-thread-sync] [--corrected]

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

from gspo_cli.runs.folder import COLD_START, EVALS, HF_CONFIG, METRICS

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


# N > 0 with pi_old recomputed on the trainer's current weights and a sequence-level correction
# towards the sampling policy: the clip window then sees one update's change, as without staleness
CORRECTED = ("rollout.use_engine_logprobs=false", "algorithm.rollout_correction=seq_truncate")
Variant = tuple[str, int, int, tuple[str, ...]]  # label, N, trainer threads, extra --set


def _variant(staleness: int, one_thread: bool = False, corrected: bool = False) -> Variant:
    """N = 0 takes both cores unless `one_thread`; N > 0 one for the trainer, one for the
    worker."""
    threads = 1 if staleness or one_thread else 2
    label = f"N={staleness}" + (f", {threads} threads" if not staleness else "")
    label += ", seq_truncate" if corrected else ""
    return label, staleness, threads, CORRECTED if corrected else ()


def _train(variant: Variant, seed: int, steps: int, out: Path) -> Path:
    _, staleness, threads, extra = variant
    folder = out / f"n{staleness}-t{threads}{'-corrected' if extra else ''}-s{seed}"
    if not (folder / "summary.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copytree(_cold_start(seed, out), folder / COLD_START, dirs_exist_ok=True)
        sets = [f"trainer.seed={seed}", f"trainer.steps={steps}", f"name={folder.name}", *extra]
        if staleness:
            sets += [f"rollout.max_staleness={staleness}", "rollout.worker_threads=1"]
        _gspo("train", folder, threads, *sets)
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


def report(curves: dict[tuple[str, int], list[tuple[int, float, float]]], base: str) -> str:
    """Markdown: each run's figures, then each variant against `base` paired by round."""
    lines = [
        "| run | round | steps/hour | held-out accuracy at each eval | reaches base's final at |",
        "|---|---|---|---|---|",
    ]
    speedups: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    for (label, seed), curve in curves.items():
        reference = curves.get((base, seed))
        if not curve or not reference:
            continue
        target = reference[-1][2]
        reached = _time_to(curve, target)
        step, wall, _ = curve[-1]
        accuracies = " ".join(f"{a:.1%}@{s}" for s, _, a in curve)
        when = "not reached" if reached is None else f"{reached:.0f}s"
        lines.append(f"| {label} | {seed} | {3600 * step / wall:.0f} | {accuracies} | {when} |")
        base_time = _time_to(reference, target)
        if label == base:
            continue
        if reached and base_time:
            speedups.setdefault(label, []).append(base_time / reached)
        speedups.setdefault(label, [])
        gaps.setdefault(label, []).extend(
            a - b for (_, _, a), (_, _, b) in zip(curve, reference, strict=False)
        )
    lines.append("")
    noise = 2 * math.sqrt(0.25 / SAMPLES) * math.sqrt(2)  # two SE of a difference, at p = 0.5
    for label, ratios in speedups.items():
        shown = ", ".join(f"{r:.2f}x" for r in ratios) or "never"
        mean_gap = sum(gaps[label]) / max(1, len(gaps[label]))
        lines.append(
            f"{label}: reaches {base}'s final accuracy {shown} as fast (per round; > 1 is "
            f"sooner); held-out accuracy at equal steps {mean_gap:+.1%} on average against "
            f"{base} (noise of one difference: +-{noise:.1%})"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--staleness", default="1,2", help="the N > 0 to run against N = 0")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--one-thread-sync",
        action="store_true",
        help="also N = 0 on one thread: what overlapping alone buys, at equal threads per process",
    )
    parser.add_argument(
        "--corrected",
        action="store_true",
        help="also N = 1 with pi_old recomputed and algorithm.rollout_correction seq_truncate",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [_variant(0)] + [_variant(int(v)) for v in args.staleness.split(",")]
    variants += [_variant(0, one_thread=True)] if args.one_thread_sync else []
    variants += [_variant(1, corrected=True)] if args.corrected else []
    curves = {}
    for round_index, seed in enumerate(range(1, args.rounds + 1)):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:  # interleaved: each goes first once
            folder = _train(variant, seed, args.steps, args.out)
            if (folder / "summary.json").exists():
                curves[variant[0], seed] = _curve(folder)
    table = report(dict(sorted(curves.items(), key=lambda kv: kv[0][1])), variants[0][0])
    (args.out / "async_rollouts.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
