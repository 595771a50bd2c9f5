"""Training-engine throughput: plain torch vs DeepSpeed (1 and 2 processes), dense and MoE.

Each configuration runs `gspo train` for a few RL steps of the quickstart's batch shape (no cold
start) in a temporary folder and reports steps/s and completion tokens/s from metrics.jsonl,
skipping the first (warm-up) step. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/engine_throughput.py [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [("torch", 1), ("deepspeed", 1), ("deepspeed", 2)]


def run(model: str, engine: str, nproc: int, steps: int, folder: Path) -> dict[str, float]:
    out = folder / f"{model.split(':')[-1]}-{engine}-{nproc}"
    command = [
        sys.executable,
        "-m",
        "gspo_cli.cli",
        "train",
        str(REPO / "recipes" / "quickstart.yaml"),
        "--out",
        str(out),
        "--nproc",
        str(nproc),
        "--set",
        f"model.path={model}",
        "--set",
        "cold_start.enabled=false",
        "--set",
        f"trainer.engine={engine}",
        "--set",
        f"trainer.steps={steps}",
        "--set",
        "eval.num_problems=1",
        "--set",
        "eval.samples=1",
        "--set",
        "eval.every=1000",
        "--set",
        "logging.console=plain",
        "--set",
        "trainer.checkpoint_every=1000",
    ]
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]
    step_s = statistics.mean(r["time_step_s"] for r in records)
    return {
        "steps_per_s": 1.0 / step_s,
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in records),
        "train_s": statistics.mean(r["time_train_s"] for r in records),
        "rollout_s": statistics.mean(r["time_rollout_s"] for r in records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    table = Table(title=f"RL step throughput, 16 prompts x 8 samples, {args.steps - 1} timed steps")
    for col in ("model", "engine", "processes", "steps/s", "tokens/s", "rollout s", "train s"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("builtin:tiny-dense", "builtin:tiny-moe"):
            for engine, nproc in CONFIGS:
                m = run(model, engine, nproc, args.steps, Path(tmp))
                table.add_row(
                    model,
                    engine,
                    str(nproc),
                    f"{m['steps_per_s']:.3f}",
                    f"{m['tokens_per_s']:.0f}",
                    f"{m['rollout_s']:.2f}",
                    f"{m['train_s']:.2f}",
                )
                Console(stderr=True).print(f"done: {model} {engine} x{nproc}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
