"""Fakes and builders for tests of the RL step on the built-in tiny models: fixed prompts, a
reward with signal in every group, a replayed rollout, an engine that keeps its gradients, and
`tiny_step`, the `StepSettings` of a test's step."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.step_settings import algorithm_settings, collection_settings
from gspo_cli.train.step.environments import StepEnvironment
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.settings import StepSettings

PROMPTS = [
    [2, 10, 11, 12, 3, 6, 2],
    [2, 20, 21, 3, 6, 2],
    [2, 30, 31, 32, 33, 3, 6, 2],
    [2, 40, 3, 6, 2],
]
GROUP = 4


def tiny_step(
    recipe: Recipe | None = None,
    *,
    sampling: SamplingParams | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **differs: Any,
) -> StepSettings:
    """The settings of a test's RL step: `recipe`'s algorithm and collection (default
    `Recipe()`'s), `sampling` (default `SamplingParams()`), the pad id of `tokenizer` (0
    without one); any other `StepSettings` field by keyword, where the test sets it."""
    recipe = Recipe() if recipe is None else recipe
    fields: dict[str, Any] = {
        "algorithm": algorithm_settings(recipe.algorithm),
        "collection": collection_settings(recipe.rollout),
        **differs,
    }
    return StepSettings(
        sampling=SamplingParams() if sampling is None else sampling,
        pad_id=0 if tokenizer is None else int(tokenizer.pad_token_id),
        **fields,
    )


def one_environment(
    engine: Any, reward: Any, rows: int, sampling: SamplingParams, name: str = "main"
) -> StepEnvironment:
    """A step environment of `rows` rows from a test's engine and reward (fakes included)."""
    return StepEnvironment(name, engine, reward, sampling, range(rows))


class LengthParityReward:
    """A deterministic reward that varies within groups, so every group carries signal."""

    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: Any = None,
        truncated: Any = None,
    ) -> RewardScores:
        scores = [float(len(c) % 2) for c in completions]
        return RewardScores(scores, scores, {})


class FixedRollout:
    """Replays one rollout so that two training set-ups see identical data."""

    def __init__(self, batch: RolloutBatch) -> None:
        self.batch = batch

    def sync_weights(self) -> None:
        pass

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        **_: object,
    ) -> RolloutBatch:
        return self.batch


class GradCapturingEngine(TorchEngine):
    """Records the accumulated gradients of every optimiser step before applying it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.grads: list[dict[str, torch.Tensor]] = []

    def step(self, skip: bool = False) -> tuple[float, bool]:
        self.grads.append(
            {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}
        )
        return super().step(skip)
