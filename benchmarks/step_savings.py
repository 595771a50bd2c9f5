"""What the RL step's savings buy, each against the step without it, on identical data.

- zero-advantage skipping, length bucketing and each distinct prompt run once: the training
  part of a step (pi_old forward and the minibatch updates) on one fixed rollout whose share
  of no-signal groups is set;
- batched seeded sampling (per-row exact draws) against one `generate` per prompt (the former
  seeded path) and against unseeded batched sampling;
- the MoE volatility probe: a MoE step with and without it (`StepSettings.measure_volatility`);
- the maths verifier: 2 pool workers with chunked tasks, against one task per answer (the
  former pool) and against checking in this process.

Interleaved rounds and paired ratios (each round times every variant back to back), one torch
thread: this machine is shared, and figures from separate runs drift. Prints; asserts nothing.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_savings.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from gspo_cli.data import load_rows, render_prompt
from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.rewards.math_verifier import MathVerifierPool, check_answer, check_answers
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.step_settings import algorithm_settings, collection_settings
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.settings import StepSettings
from gspo_cli.train.step.update import StepModels, rl_step

PROMPTS, SAMPLES = 16, 8  # the quickstart's batch


class FixedRollout:
    def __init__(self, batch: RolloutBatch) -> None:
        self.batch = batch

    def sync_weights(self) -> None:
        pass

    def generate(self, *_: Any, **__: Any) -> RolloutBatch:
        return self.batch


class NoSignalShare:
    """The first `share` of the groups score 1 on every sample (no signal); the rest vary."""

    def __init__(self, share: float) -> None:
        self.constant_rows = round(share * PROMPTS) * SAMPLES

    def __call__(
        self, completions: list[str], rows: list[Any], completion_ids: Any = None
    ) -> RewardScores:
        scores = [
            1.0 if i < self.constant_rows else float(len(c) % 2) for i, c in enumerate(completions)
        ]
        return RewardScores(scores, scores, {})


def _prompts(tokenizer: Any) -> list[list[int]]:
    recipe = Recipe.model_validate({})
    rows = load_rows(recipe.data.source, "train", recipe.data)[:PROMPTS]
    return [render_prompt(tokenizer, r["prompt"], recipe.data) for r in rows]


def _timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _train_seconds(
    model: torch.nn.Module,
    rollout: FixedRollout,
    reward: NoSignalShare,
    share_prompts: bool = True,
    **step: Any,
) -> float:
    """The training part of one step (pi_old forward + 4 minibatch updates) from `model`'s
    weights, on a fresh copy so that every variant starts from the same point."""
    copy_ = copy.deepcopy(model)
    recipe = Recipe.model_validate(
        {"algorithm": {"minibatches": 4}, "trainer": {"share_prompts": share_prompts}}
    )
    settings = StepSettings(
        algorithm=algorithm_settings(recipe.algorithm),
        sampling=SamplingParams(num_samples=SAMPLES),
        pad_id=0,
        collection=collection_settings(recipe.rollout),
        **step,
    )
    engine = TorchEngine(copy_, engine_settings(recipe), LOCAL)
    prompts = rollout.batch.prompt_ids[::SAMPLES]
    out = rl_step(StepModels(engine), rollout, reward, prompts, [{}] * PROMPTS, settings, 0)
    return out.metrics["time_train_s"]


def _table(title: str, seconds: dict[str, list[float]], base: str, items: int = 0) -> Table:
    """Median seconds and median paired ratio per variant (and items/s when `items`)."""
    table = Table(title=title)
    columns = ["variant", "median s", f"paired ratio to {base}"] + (["per s"] if items else [])
    for col in columns:
        table.add_column(col, justify="right")
    for name, values in seconds.items():
        ratios = [v / b for v, b in zip(values, seconds[base], strict=True)]
        median = statistics.median(values)
        cells = [name, f"{median:.3f}", f"{statistics.median(ratios):.2f}x"]
        table.add_row(*cells, *([f"{items / median:.0f}"] if items else []))
    return table


def training(rounds: int, console: Console) -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    torch.manual_seed(0)
    params = SamplingParams(max_new_tokens=64, num_samples=SAMPLES)
    batch = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    rollout = FixedRollout(batch)
    lengths = [len(c) for c in batch.completion_ids]
    console.print(
        f"fixed rollout: {len(lengths)} responses, mean length {statistics.mean(lengths):.1f}, "
        f"max {max(lengths)}"
    )
    prompt = statistics.mean(len(p) for p in batch.prompt_ids)
    console.print(f"prompts: mean {prompt:.1f} tokens, each shared by {SAMPLES} responses")
    variants: dict[str, tuple[bool, dict[str, Any]]] = {  # (share_prompts, step settings)
        "everything": (False, {"skip_zero_advantage": False}),
        "skip zero-advantage": (False, {}),
        "skip + 256-token micro-batches": (False, {"max_tokens_per_micro_batch": 256}),
        "each prompt once": (True, {"skip_zero_advantage": False}),
        "skip + each prompt once (defaults)": (True, {}),
    }
    for share in (0.0, 0.16, 0.5):
        seconds: dict[str, list[float]] = defaultdict(list)
        for _ in range(rounds):
            for name, (shared, step) in variants.items():
                reward = NoSignalShare(share)
                seconds[name].append(_train_seconds(model, rollout, reward, shared, **step))
        title = f"training part of a step, {share:.0%} of groups without signal"
        console.print(_table(title, seconds, "everything"))


def sampling(rounds: int, console: Console) -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    engine = HFGenerateEngine(model, tokenizer)
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=64, num_samples=SAMPLES)
    seeds = list(range(PROMPTS))

    def per_prompt() -> None:  # the former seeded path: one generate per prompt
        for prompt, seed in zip(prompts, seeds, strict=True):
            torch.manual_seed(seed)
            engine.generate([prompt], params)

    variants: dict[str, Callable[[], Any]] = {
        "batched, unseeded": lambda: engine.generate(prompts, params),
        "batched, seeded per row (exact draw)": lambda: engine.generate(prompts, params, seeds),
        "one generate per prompt, seeded": per_prompt,
    }
    seconds: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for name, run in variants.items():
            seconds[name].append(_timed(run))
    title = f"rollout of {PROMPTS} prompts x {SAMPLES} samples, 64 new tokens at most"
    console.print(_table(title, seconds, "batched, unseeded"))


def moe_probe(rounds: int, console: Console) -> None:
    model, tokenizer = create_builtin("tiny-moe", seed=0)
    torch.manual_seed(0)
    params = SamplingParams(max_new_tokens=64, num_samples=SAMPLES)
    rollout = FixedRollout(HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params))
    reward = NoSignalShare(0.0)
    seconds: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        seconds["with the probe"].append(_train_seconds(model, rollout, reward))
        seconds["without"].append(_train_seconds(model, rollout, reward, measure_volatility=False))
    console.print(_table("tiny-moe training part, volatility probe", seconds, "without"))


def maths_pool(rounds: int, console: Console) -> None:
    answers = [str(i) for i in range(512)]
    completions = [
        f"so the answer is \\boxed{{{a if i % 2 else a + '1'}}}" for i, a in enumerate(answers)
    ]
    pairs = list(zip(completions, answers, strict=True))
    pool = MathVerifierPool(num_workers=2)
    pool.score(completions[:8], answers[:8])  # start the workers and import Math-Verify

    def per_answer() -> None:  # the former pool: one task per answer
        executor = pool._executor()
        futures = [executor.submit(check_answer, c, a, pool.timeout_s) for c, a in pairs]
        [f.result() for f in futures]

    variants: dict[str, Callable[[], Any]] = {
        "this process": lambda: check_answers(pairs, pool.timeout_s),
        "2 workers, chunked": lambda: pool.score(completions, answers),
        "2 workers, one task per answer": per_answer,
    }
    seconds: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for name, run in variants.items():
            seconds[name].append(_timed(run))
    pool.close()
    console.print(_table(f"maths verifier, {len(pairs)} answers", seconds, "this process", 512))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console(width=120)
    console.print(f"torch {torch.__version__}, 1 thread, {args.rounds} interleaved rounds")
    training(args.rounds, console)
    sampling(args.rounds, console)
    moe_probe(args.rounds, console)
    maths_pool(args.rounds, console)


if __name__ == "__main__":
    main()
