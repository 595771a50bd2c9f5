"""What taking pi_old from the rollout engine saves: whole RL steps with the trainer's pi_old
recompute (`rollout.use_engine_logprobs: false`) against the default `auto` (the engine's
log-probs, a few rows recomputed each step as a check; train/step/old_policy.py).

Each variant trains its own copy of the model from the same weights, on the same prompts and
step seeds, so both follow a real run's trajectory; every round runs one step of each, back to
back, the order alternating (interleaved rounds, paired ratios, one torch thread: this machine
is shared, and figures from separate runs drift). Round 0 warms up and is not counted.

Workloads:
- quickstart: the quickstart's cold-started checkpoint (made first with `gspo sft`, about a
  minute), its training prompts (16 x 8), its maths verifier, 64 new tokens at most, 4
  minibatches, its learning rate: the quickstart's RL step exactly.
- dense-103m: vs_trl's Qwen3 of 103M parameters (151,936-token vocabulary, random weights,
  so responses run to the 64-token cap), 8 prompts x 8, 4 minibatches, a length-parity reward.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_logprobs.py [--workload quickstart]
        [--rounds 6]

`--learning DIR` instead trains the whole quickstart (cold start and 100 GSPO steps) once per
seed and variant, seeds 1-3 by default, into DIR, and compares held-out accuracy with
`gspo compare --group-seeds` (mean over seeds with 95% intervals). About 4 minutes a run on 2
idle cores.

Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from gspo_cli.data.prompts import render_prompt
from gspo_cli.data.sources import load_rows
from gspo_cli.models.loading import load_policy
from gspo_cli.recipe import Recipe, load_recipe
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.step_settings import step_settings
from gspo_cli.train.step.rewards import RewardScores, WeightedRewards
from gspo_cli.train.step.update import StepModels, rl_step

VARIANTS = {"recompute pi_old (false)": False, "engine log-probs (auto)": "auto"}
BASE = "recompute pi_old (false)"


class LengthParity:
    """dense-103m's reward: varies within groups, so every group carries signal."""

    def __call__(
        self, completions: list[str], rows: list[dict[str, Any]], completion_ids: Any = None
    ) -> RewardScores:
        scores = [float(len(c) % 2) for c in completions]
        return RewardScores(scores, scores, {})


def quickstart() -> tuple[Recipe, Any, Any, list[list[int]], list[dict[str, Any]], Any]:
    """The quickstart recipe, its cold-started model, prompts, rows and reward."""
    import quickstart_workload

    recipe = load_recipe(quickstart_workload.RECIPE)
    folder = tempfile.mkdtemp(prefix="engine-logprobs-")
    model, tokenizer = load_policy(quickstart_workload.cold_start(folder))
    rows = load_rows(recipe.data.source, "train", recipe.data)
    prompts = [render_prompt(tokenizer, r["prompt"], recipe.data) for r in rows]
    pool = MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s)
    reward = WeightedRewards(recipe.reward, RewardServices(math_pool=pool))
    return recipe, model.float().train(), tokenizer, prompts, rows, reward


def dense_103m() -> tuple[Recipe, Any, Any, list[list[int]], list[dict[str, Any]], Any]:
    from vs_trl.shapes import SHAPES, build, prompt_texts  # the vs_trl package, beside this

    model, tokenizer = build(SHAPES["dense-103m"], "fixed")
    texts = prompt_texts(tokenizer)
    prompts = [list(tokenizer(t)["input_ids"]) for t in texts]
    recipe = Recipe.model_validate(
        {
            "rollout": {"num_prompts": 8, "group_size": 8, "max_new_tokens": 64},
            "algorithm": {"minibatches": 4},
        }
    )
    rows = [{"prompt": t, "answer": ""} for t in texts]
    return recipe, model, tokenizer, prompts, rows, LengthParity()


def run(workload: str, rounds: int, console: Console) -> None:
    recipe, model, tokenizer, prompts, rows, reward = (
        quickstart() if workload == "quickstart" else dense_103m()
    )
    q = recipe.rollout.num_prompts
    sides = {}
    for name, mode in VARIANTS.items():
        copy_ = copy.deepcopy(model)
        chosen = recipe.model_copy(deep=True)
        chosen.rollout.use_engine_logprobs = mode
        settings = step_settings(chosen, int(tokenizer.pad_token_id))
        sides[name] = (
            TorchEngine(copy_, engine_settings(chosen), LOCAL),
            HFGenerateEngine(copy_, tokenizer),
            settings,
        )
    seconds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    facts: dict[str, list[float]] = defaultdict(list)
    for step in range(rounds + 1):
        batch = [(step * q + i) % len(prompts) for i in range(q)]
        order = list(sides) if step % 2 == 0 else list(reversed(sides))
        for name in order:
            engine, rollout, settings = sides[name]
            torch.manual_seed(1000 + step)  # the same sampling noise for both sides
            out = rl_step(
                StepModels(engine), rollout, reward, [prompts[i] for i in batch],
                [rows[i] for i in batch], settings, step,
            )  # fmt: skip
            if step == 0:
                continue  # warm-up
            for key in ("time_step_s", "time_train_s", "time_rollout_s"):
                seconds[key][name].append(out.metrics[key])
            if name != BASE:
                facts["from_engine"].append(out.metrics["pi_old_from_engine"])
                facts["gap"].append(out.metrics.get("engine_gap_seq_max", float("nan")))
            facts[f"{name} tokens"].append(out.metrics["completion_tokens"])
    _report(workload, rounds, seconds, facts, console)


def _report(
    workload: str,
    rounds: int,
    seconds: dict[str, dict[str, list[float]]],
    facts: dict[str, list[float]],
    console: Console,
) -> None:
    table = Table(title=f"{workload}: {rounds} interleaved rounds, one torch thread")
    for col in ("variant", "step s", "training s", "rollout s", "step: paired speed-up"):
        table.add_column(col, justify="right")
    for name in VARIANTS:
        ratios = [
            b / v
            for v, b in zip(seconds["time_step_s"][name], seconds["time_step_s"][BASE], strict=True)
        ]
        table.add_row(
            name,
            f"{statistics.median(seconds['time_step_s'][name]):.2f}",
            f"{statistics.median(seconds['time_train_s'][name]):.2f}",
            f"{statistics.median(seconds['time_rollout_s'][name]):.2f}",
            f"{statistics.median(ratios):.2f}x",
        )
    console.print(table)
    train = [
        b / v
        for v, b in zip(
            seconds["time_train_s"]["engine log-probs (auto)"], seconds["time_train_s"][BASE],
            strict=True,
        )
    ]  # fmt: skip
    console.print(
        f"training part: paired speed-up {statistics.median(train):.2f}x; auto used the engine's "
        f"log-probs on {sum(facts['from_engine']):.0f} of {len(facts['from_engine'])} steps; "
        f"largest checked sequence gap {max(facts['gap']):.2e}"
    )
    for name in VARIANTS:
        tokens = facts[f"{name} tokens"]
        console.print(f"{name}: {statistics.mean(tokens):.0f} completion tokens a step")


def learning(out: Path, seeds: list[int]) -> None:
    """The quickstart trained per seed with each pi_old source, then compared seed-grouped."""
    recipe = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"
    gspo = [sys.executable, "-m", "gspo_cli.cli"]
    folders = []
    for seed in seeds:
        for label, value in (("recompute", "false"), ("auto", "auto")):
            name = f"quickstart-{label}-s{seed}"
            folders.append(str(out / name))
            if (out / name / "summary.json").exists():
                continue  # finished earlier: a rerun picks up where it stopped
            sets = [f"name={name}", f"trainer.seed={seed}", f"rollout.use_engine_logprobs={value}"]
            args = [arg for item in sets for arg in ("--set", item)]
            subprocess.run([*gspo, "train", str(recipe), *args, "--out", folders[-1]], check=True)
    compare = [*gspo, "compare", *folders, "--group-seeds", "--out", str(out / "comparison")]
    subprocess.run(compare, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("quickstart", "dense-103m"), default="quickstart")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--learning", type=Path, help="train whole quickstart runs into DIR")
    parser.add_argument("--seeds", default="1,2,3", help="--learning: comma-separated")
    args = parser.parse_args()
    if args.learning:
        learning(args.learning, [int(s) for s in args.seeds.split(",")])
        return
    torch.set_num_threads(1)
    run(args.workload, args.rounds, Console())


if __name__ == "__main__":
    main()
