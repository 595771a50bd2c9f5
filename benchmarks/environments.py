"""Environments, measured: a mixture of three against each environment alone, and the curriculum
against uniform sampling on the mixture (recipes/environments/tiny-mixture.yaml).

Every run starts from one cold start (`gspo sft` of the mixture: the arithmetic and the tools
environments' worked solutions; chain_sum has none) and trains `--steps` RL steps:

- mixture: the three environments by weight (2:1:1), uniform sampling;
- curriculum: the same, with data.curriculum (K = 2 visits, N = 1 epoch);
- alone/NAME: one environment, all steps on it (the same total steps as the mixture).

Held-out accuracy of each environment is measured every `--every` steps on its own held-out
set (`--problems` x 4 samples). Per seed (trainer.seed; the sampling and data order follow it)
it prints, per environment, the final held-out accuracy of the mixture, of that environment
alone and of the curriculum run; then, paired by seed, the mixture minus alone; the share of
groups without signal (zero_adv_group_frac, mean over steps) with and without the curriculum;
and the step at which each of the two first reached the uniform run's final weighted accuracy
(linear between evaluations; "-" when it did not), with their ratio. One torch thread per
run, one run at a time. A finished run (summary.json) is not run again. Prints; asserts nothing.
`--train-size N` cuts every environment's training set to N problems, so that a run revisits
its prompts (the curriculum judges a prompt on its visits); `--visits K` is the curriculum's K.

    .venv/bin/python benchmarks/environments.py DIR [--seeds 1,2] [--steps 60] [--every 15]
        [--train-size N] [--visits K] [--kinds mixture,curriculum,alone] [--recipe R]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gspo_cli.runs.folder import COLD_START, EVALS, METRICS

MIXTURE = Path(__file__).resolve().parent.parent / "recipes" / "environments" / "tiny-mixture.yaml"
GSPO = [sys.executable, "-m", "gspo_cli.cli"]


def _run(command: str, recipe: Path, out: Path) -> None:
    if (out / "summary.json").is_file() or (command == "sft" and (out / COLD_START).is_dir()):
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = out.parent / f"{out.name}.log"
    args = [*GSPO, command, str(recipe), "--out", str(out), "--set", "logging.console=plain"]
    with log.open("w") as handle:
        done = subprocess.run(args, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{out.name} failed: see {log}")


def _shrink(raw: dict[str, Any], size: int) -> None:
    """Every environment's training set cut to `size` problems (held-out sets unchanged)."""
    raw["data"].setdefault("arithmetic", {})["num_train"] = size
    for env in raw["environments"]:
        data = env.setdefault("data", {})
        if "arithmetic" in data:
            data["arithmetic"]["num_train"] = size
        if "reasoning_gym" in data:
            data["reasoning_gym"]["size"] = size


def _recipe(folder: Path, name: str, changes: dict[str, Any], base: dict[str, Any]) -> Path:
    raw = {**base, **changes}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _evals(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / EVALS).read_text().splitlines()]


def _zero_signal(run: Path) -> float:
    steps = [json.loads(line) for line in (run / METRICS).read_text().splitlines()]
    return sum(s["zero_adv_group_frac"] for s in steps) / len(steps)


def _env_accuracy(record: dict[str, Any], name: str) -> float:
    return float(record.get(f"env/{name}/accuracy", record["accuracy"]))


def _steps_to(evals: list[dict[str, Any]], target: float) -> float | None:
    """The first step (linear between evaluations) at which accuracy reached `target`."""
    for before, after in itertools.pairwise(evals):
        if after["accuracy"] >= target:
            gain = after["accuracy"] - before["accuracy"]
            share = 1.0 if gain <= 0 else (target - before["accuracy"]) / gain
            return before["step"] + max(0.0, share) * (after["step"] - before["step"])
    return None


def _mean_and_half(values: list[float]) -> str:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:+.3f} (sd {sd:.3f}, n {len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=15)
    parser.add_argument("--problems", type=int, default=50)
    parser.add_argument(
        "--train-size", type=int, default=0,
        help="Training problems per environment (0: the recipe's): small enough that the run "
        "revisits its prompts, which the curriculum needs",
    )  # fmt: skip
    parser.add_argument("--visits", type=int, default=2, help="The curriculum's K.")
    parser.add_argument("--kinds", default="mixture,curriculum,alone")
    parser.add_argument("--recipe", type=Path, default=MIXTURE, help="The mixture's recipe.")
    args = parser.parse_args()
    folder = args.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(args.recipe.read_text())
    raw.setdefault("data", {})
    wanted = set(args.kinds.split(","))
    if args.train_size:
        _shrink(raw, args.train_size)
    names = [env["name"] for env in raw["environments"]]
    _run("sft", _recipe(folder, "sft", {}, raw), folder / "sft")
    start = {
        "model": {"path": str(folder / "sft" / COLD_START)},
        "cold_start": {"enabled": False},
        "trainer": {**raw["trainer"], "steps": args.steps, "checkpoint_every": args.steps},
        "eval": {**raw["eval"], "every": args.every, "num_problems": args.problems},
    }
    results: dict[str, dict[int, Path]] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        seeded = {**start, "trainer": {**start["trainer"], "seed": seed}}
        kinds = {
            "mixture": {},
            "curriculum": {
                "data": {**raw["data"], "curriculum": {"enabled": True, "visits": args.visits}}
            },
            **{
                f"alone-{name}": {
                    "environments": [e for e in raw["environments"] if e["name"] == name]
                }
                for name in names
            },
        }
        for kind, changes in kinds.items():
            if kind.split("-")[0] not in wanted:
                continue
            out = folder / f"{kind}-seed{seed}"
            recipe = _recipe(folder, f"{kind}-seed{seed}", {**seeded, **changes}, raw)
            _run("train", recipe, out)
            results.setdefault(kind, {})[seed] = out
    _report(results, names)


def _report(results: dict[str, dict[int, Path]], names: list[str]) -> None:
    seeds = sorted(results["mixture"])
    print("final held-out accuracy per environment (avg@k, the recipe's eval.samples):")
    for name in names:
        alone = results.get(f"alone-{name}")
        for seed in seeds:
            mixed = _env_accuracy(_evals(results["mixture"][seed])[-1], name)
            curriculum = (
                _env_accuracy(_evals(results["curriculum"][seed])[-1], name)
                if "curriculum" in results
                else math.nan
            )
            own = (
                ""
                if alone is None
                else f"  alone {_env_accuracy(_evals(alone[seed])[-1], name):.3f}"
            )
            print(
                f"  {name:12s} seed {seed}: mixture {mixed:.3f}{own}  curriculum {curriculum:.3f}"
            )
        if alone is not None:
            gaps = [
                _env_accuracy(_evals(results["mixture"][s])[-1], name)
                - _env_accuracy(_evals(alone[s])[-1], name)
                for s in seeds
            ]
            print(f"  {name:12s} mixture - alone: {_mean_and_half(gaps)}")
    for seed in seeds if "curriculum" in results else []:
        uniform, curriculum = results["mixture"][seed], results["curriculum"][seed]
        target, steps = _evals(uniform)[-1]["accuracy"], _evals(uniform)[-1]["step"]
        set_aside = sum(
            json.loads(line).get("curriculum_set_aside_new", 0.0)
            for line in (curriculum / METRICS).read_text().splitlines()
        )
        reached = {
            name: _steps_to(_evals(run), target)
            for name, run in (("uniform", uniform), ("curriculum", curriculum))
        }
        when = ", ".join(
            f"{name} at step {'-' if step is None else f'{step:.0f}'}"
            for name, step in reached.items()
        )
        ratio = (
            "" if None in reached.values() or not reached["uniform"]
            else f" (curriculum / uniform {reached['curriculum'] / reached['uniform']:.0%})"  # type: ignore[operator]
        )  # fmt: skip
        print(
            f"seed {seed}: prompts set aside {set_aside:.0f}; groups without signal "
            f"{_zero_signal(uniform):.3f} uniform, {_zero_signal(curriculum):.3f} curriculum; "
            f"uniform's final weighted accuracy {target:.3f} (step {steps}) first reached: "
            f"{when}{ratio}"
        )


if __name__ == "__main__":
    main()
