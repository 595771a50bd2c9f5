"""Replay the collapse guard's reward-crash rule over recorded runs: its false alarms on healthy
runs, and its delay on planted collapses, with and without the noise test (REWARD_Z).

    python benchmarks/guard_replay.py RUN_DIR_OR_SERIES.json ... [--plant-at 30]

Each argument is a run folder (its metrics.jsonl) or a JSON file of one run's per-step rewards
(tests/data/recorded_rewards/). For each run it prints the reward-crash alarms of the rule as it
stands and of the rule without its noise test (REWARD_Z = 0: the rule before it), then plants
collapses from --plant-at on (the reward falls to 0, to a tenth of itself, to half of itself)
and prints how many steps after it each rule catches them (None: never).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gspo_cli.runs import collapse
from gspo_cli.runs.folder import read_jsonl


def load_rewards(path: Path) -> list[float]:
    if path.is_dir():
        return [float(r["reward_mean"]) for r in read_jsonl(path / "metrics.jsonl")]
    return [float(x) for x in json.loads(path.read_text())["reward_mean"]]


@contextmanager
def noise_test(z: float) -> Iterator[None]:
    saved = collapse.REWARD_Z
    collapse.REWARD_Z = z
    try:
        yield
    finally:
        collapse.REWARD_Z = saved


def crash_steps(rewards: list[float]) -> list[int]:
    """The steps the reward-crash rule fires at, replaying `rewards` (steps 1..n)."""
    records = [{"step": s, "reward_mean": r} for s, r in enumerate(rewards, start=1)]
    return [e.step for e in collapse.replay(records) if e.signal == "reward_crash"]


def first_after(steps: list[int], start: int) -> int | None:
    return next((s for s in steps if s >= start), None)


def report(name: str, rewards: list[float], plant_at: int) -> dict[str, object]:
    before = rewards[: plant_at - 1]
    planted = {
        "zero": before + [0.0] * (len(rewards) - len(before)),
        "tenth": before + [r / 10 for r in rewards[plant_at - 1 :]],
        "half": before + [r / 2 for r in rewards[plant_at - 1 :]],
    }
    row: dict[str, object] = {"run": name, "steps": len(rewards)}
    for label, z in (("now", collapse.REWARD_Z), ("no_noise_test", 0.0)):
        with noise_test(z):
            row[f"false_alarms_{label}"] = crash_steps(rewards)
            for kind, series in planted.items():
                caught = first_after(crash_steps(series), plant_at)
                row[f"{kind}_delay_{label}"] = None if caught is None else caught - plant_at
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--plant-at", type=int, default=30)
    args = parser.parse_args()
    for path in args.runs:
        if path.is_dir() and not (path / "metrics.jsonl").is_file():
            continue  # not a run folder (a cold start, a log)
        rewards = load_rewards(path)
        if len(rewards) < args.plant_at + 5:
            print(f"{path}: {len(rewards)} steps, too short to plant at {args.plant_at}")
            continue
        print(json.dumps(report(str(path), rewards, args.plant_at)))


if __name__ == "__main__":
    main()
