"""Throughput of one RL step (completion tokens/s end to end) and its time split.

Runs the real step (HF generate rollouts, Math-Verify rewards, GSPO loss, AdamW) on the built-in
tiny dense and MoE models with the quickstart's batch shape. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/rl_step_throughput.py [--steps 3] [--algorithm gspo]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from gspo_cli.data import load_rows, render_prompt
from gspo_cli.models import load_policy
from gspo_cli.recipe import Recipe
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.step_settings import algorithm_settings, collection_settings
from gspo_cli.train.step.rewards import WeightedRewards
from gspo_cli.train.step.settings import StepSettings
from gspo_cli.train.step.update import StepModels, rl_step


def measure(model_path: str, algorithm: str, steps: int, device: str) -> dict[str, float]:
    recipe = Recipe.model_validate(
        {"model": {"path": model_path}, "algorithm": {"name": algorithm}, "optimizer": {"lr": 3e-5}}
    )
    torch.manual_seed(0)
    model, tokenizer = load_policy(model_path)
    model.to(device).train()
    rows = load_rows(recipe.data.source, "train", recipe.data)
    prompts = [render_prompt(tokenizer, r["prompt"], recipe.data) for r in rows]
    r = recipe.rollout
    settings = StepSettings(
        algorithm=algorithm_settings(recipe.algorithm),
        sampling=SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens, r.group_size),
        pad_id=int(tokenizer.pad_token_id),
        collection=collection_settings(r),
    )
    engine = TorchEngine(model, engine_settings(recipe), LOCAL)
    pool = MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s)
    rollout = HFGenerateEngine(model, tokenizer)
    reward = WeightedRewards(recipe.reward, RewardServices(math_pool=pool))
    samples = []
    for step in range(steps + 1):  # the first step warms up (allocations, verifier pool)
        index = list(range(step * r.num_prompts, (step + 1) * r.num_prompts))
        out = rl_step(
            StepModels(engine),
            rollout,
            reward,
            [prompts[i] for i in index],
            [rows[i] for i in index],
            settings,
            step,
        )
        if step:
            samples.append(out.metrics)
    pool.close()
    keys = (
        "tokens_per_s",
        "time_step_s",
        "time_rollout_s",
        "time_reward_s",
        "time_train_s",
        "completion_tokens",
    )
    return {k: statistics.mean(m[k] for m in samples) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--algorithm", default="gspo")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    table = Table(
        title=f"RL step, {args.algorithm}, 16 prompts x 8 samples, {args.device}, "
        f"torch {torch.__version__}"
    )
    for col in ("model", "tokens/s", "step s", "rollout s", "reward s", "train s", "tokens/step"):
        table.add_column(col, justify="right")
    for name in ("builtin:tiny-dense", "builtin:tiny-moe"):
        t0 = time.perf_counter()
        m = measure(name, args.algorithm, args.steps, args.device)
        table.add_row(
            name,
            f"{m['tokens_per_s']:.0f}",
            f"{m['time_step_s']:.2f}",
            f"{m['time_rollout_s']:.2f}",
            f"{m['time_reward_s']:.2f}",
            f"{m['time_train_s']:.2f}",
            f"{m['completion_tokens']:.0f}",
        )
        Console(stderr=True).print(f"{name} measured in {time.perf_counter() - t0:.0f}s")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
