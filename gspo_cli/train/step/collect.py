"""The collection phase of an RL step: G responses per prompt, generated and scored."""

from __future__ import annotations

import time
from typing import Any

import torch

from gspo_cli.algorithms.overlong import overlong_penalty
from gspo_cli.rewards.environment import ENVIRONMENT_REWARD
from gspo_cli.rollout.base import RolloutEngine
from gspo_cli.train.step.rewards import RewardModel
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.settings import StepSettings


def collect_groups(
    rollout_engine: RolloutEngine,
    reward: RewardModel,
    prompts: list[list[int]],
    rows: list[dict[str, Any]],
    settings: StepSettings,
    seeds: list[int] | None = None,
    *,
    sync: bool = True,
) -> ScoredGroups:
    """The collection phase: G responses per prompt, scored, with DAPO's overlong penalty
    added here (dynamic sampling filters on the reward the advantages will see). `sync`: make
    the engine take the trainer's weights first (once per step; its time counts as rollout)."""
    params = settings.sampling
    t0 = time.perf_counter()
    if sync:
        rollout_engine.sync_weights()
    rollout = rollout_engine.generate(prompts, params, seeds, rows=rows)
    t_rollout = time.perf_counter()
    response_rows = [row for row in rows for _ in range(params.num_samples)]
    if rollout.tool_traces is not None:  # a tool environment's own score, for `environment`
        response_rows = [
            {**row, ENVIRONMENT_REWARD: trace.environment_reward}
            for row, trace in zip(response_rows, rollout.tool_traces, strict=True)
        ]
    scores = reward(rollout.texts, response_rows, rollout.completion_ids)
    lengths = torch.tensor([len(c) for c in rollout.completion_ids])  # [N]
    overlong = overlong_penalty(
        lengths, params.max_new_tokens, settings.overlong_buffer, settings.overlong_penalty
    ).tolist()  # [N], all 0.0 when off
    rewards = [r + p for r, p in zip(scores.totals, overlong, strict=True)]
    return ScoredGroups(
        rollout, rewards, scores.correct, overlong, [True] * len(prompts), scores.metrics,
        t_rollout - t0, time.perf_counter() - t_rollout, scores.answered, scores.correct_any_form,
    )  # fmt: skip
