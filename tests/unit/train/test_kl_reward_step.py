"""A KL in the reward: the step hands its rewards to kl_reward_advantages as scored, in float64
(it computes in float64). A float32 cast on the way moved shaped rewards' advantages (an
outside check: 3.4e-7 relative); this holds the step to 1e-12 of a float64 reference computed
directly from the same log-probs (tiny model, CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gspo_cli.algorithms.kl import kl_reward_advantages
from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TorchEngine
from gspo_cli.train.step import update
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.update import StepModels, train_groups
from tests.support.rl_helpers import tiny_step

G = 4
PROMPTS = [[2, 10, 11, 3, 6, 2], [2, 20, 21, 22, 3, 6, 2]]
LENGTHS = [3, 7, 5, 2, 4, 6, 8, 3]  # response tokens of the 8 rows, group by group
# shaped: every response right, minus a small length penalty, the groups' only signal: float32
# rounds these by ~6e-8, a visible share of their spread
REWARDS = [1.0 - 1e-3 * n / 3 for n in LENGTHS]


def _scored() -> ScoredGroups:
    rollout = RolloutBatch(
        [PROMPTS[i // G] for i in range(len(LENGTHS))],
        [[30 + (i + t) % 40 for t in range(n)] for i, n in enumerate(LENGTHS)],
        None,
        [""] * len(LENGTHS),
        [False] * len(LENGTHS),
    )
    return ScoredGroups(
        rollout, list(REWARDS), [0.0] * len(LENGTHS), [0.0] * len(LENGTHS), [True] * 2
    )


def test_shaped_rewards_reach_the_kl_in_the_reward_in_float64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def spy(rewards: torch.Tensor, *tensors: torch.Tensor, **options: Any) -> Any:
        out = kl_reward_advantages(rewards, *tensors, **options)
        seen.update(tensors=tensors, options=options, advantages=out[0])
        return out

    monkeypatch.setattr(update, "kl_reward_advantages", spy)
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    reference, _ = create_builtin("tiny-dense", seed=1)
    algorithm = {"name": "grpo", "minibatches": 1, "kl_coef": 1e-4, "kl_in": "reward"}
    recipe = Recipe.model_validate({"algorithm": algorithm})
    params = SamplingParams(max_new_tokens=8, num_samples=G)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer)
    engine = TorchEngine(model, engine_settings(recipe), LOCAL)
    ref = FrozenPolicy(reference.eval().requires_grad_(False))
    train_groups(StepModels(engine, ref), _scored(), settings, step_seed=0)

    exact = torch.tensor(REWARDS, dtype=torch.float64)
    want, _ = kl_reward_advantages(exact, *seen["tensors"], **seen["options"])
    rounded, _ = kl_reward_advantages(exact.float(), *seen["tensors"], **seen["options"])

    def off(advantages: torch.Tensor) -> float:  # relative to the largest advantage
        return float((advantages - want).abs().max() / want.abs().max())

    assert off(rounded) > 1e-12  # a float32 cast shows at this tolerance
    assert off(seen["advantages"]) <= 1e-12
