"""Held-out accuracy of the policy: avg@k over a fixed set of problems, seeded."""

from __future__ import annotations

from typing import Any

import torch

from gspo_cli.rollout.base import RolloutEngine, SamplingParams
from gspo_cli.train.rewards import RewardModel


def heldout_accuracy(
    engine: RolloutEngine,
    prompts: list[list[int]],
    rows: list[dict[str, Any]],
    reward: RewardModel,
    params: SamplingParams,
    seed: int,
) -> dict[str, float]:
    """avg@k accuracy, share of problems solved at least once, and response statistics.

    Sampling runs on a forked RNG so that evaluating never changes the training run's samples.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        rollout = engine.generate(prompts, params)
    k = params.num_samples
    repeated = [row for row in rows for _ in range(k)]
    _, correct = reward(rollout.texts, repeated)
    per_problem = torch.tensor(correct).view(len(rows), k)  # [N, k]
    lengths = torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32)
    return {
        "accuracy": float(per_problem.mean()),
        "solved_any": float((per_problem.sum(dim=1) > 0).float().mean()),
        "response_len_mean": float(lengths.mean()),
        "truncated_frac": float(torch.tensor(rollout.truncated, dtype=torch.float32).mean()),
        "num_problems": float(len(rows)),
        "samples": float(k),
    }
