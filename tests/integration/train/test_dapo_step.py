"""The training phase with DAPO's overlong filtering and a short dynamic-sampling batch: rows
out of the loss add nothing to the loss or to its token count (tiny model, CPU)."""

from __future__ import annotations

import pytest
import torch

from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.settings import StepOutput
from gspo_cli.train.step.update import StepModels, train_groups
from tests.support.rl_helpers import tiny_step

G = 4
PROMPTS = [[2, 10, 11, 3, 6, 2], [2, 20, 21, 22, 3, 6, 2]]
LENGTHS = [3, 7, 5, 2, 4, 6, 8, 3]  # response tokens of the 8 rows, group by group
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # every advantage +-1
TRUNCATED = [False, True, False, False, False, False, True, False]


def _scored(in_loss: list[bool]) -> ScoredGroups:
    rollout = RolloutBatch(
        [PROMPTS[i // G] for i in range(len(LENGTHS))],
        [[30 + (i + t) % 40 for t in range(n)] for i, n in enumerate(LENGTHS)],
        None,
        [""] * len(LENGTHS),
        list(TRUNCATED),
    )
    zeros = [0.0] * len(LENGTHS)
    return ScoredGroups(rollout, list(REWARDS), list(REWARDS), zeros, in_loss)


def _train(mask_truncated: bool, in_loss: list[bool]) -> StepOutput:
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    recipe = Recipe.model_validate(
        {
            "algorithm": {
                "name": "grpo",
                "minibatches": 1,
                "loss_agg": "token_mean",
                "mask_truncated": mask_truncated,
            }
        }
    )
    params = SamplingParams(max_new_tokens=8, num_samples=G)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer)
    engine = TorchEngine(model, engine_settings(recipe), LOCAL)
    return train_groups(StepModels(engine), _scored(in_loss), settings, step_seed=0)


def _expected(rows: list[int]) -> tuple[float, float]:
    """On policy (ratio 1) the GRPO token-mean loss is -sum_i A_i |y_i| / sum_i |y_i| over the
    rows in the loss; A_i = +-1 from each WHOLE group's rewards (masked rows included)."""
    advantages = [1.0 if r == 1.0 else -1.0 for r in REWARDS]
    tokens = sum(LENGTHS[i] for i in rows)
    return -sum(advantages[i] * LENGTHS[i] for i in rows) / tokens, float(tokens)


def test_a_masked_truncated_sample_adds_nothing_to_loss_or_token_count() -> None:
    everything = _train(False, [True, True])
    masked = _train(True, [True, True])
    loss, tokens = _expected([i for i in range(8) if not TRUNCATED[i]])
    assert masked.metrics["loss"] == pytest.approx(loss, abs=1e-5)
    assert masked.metrics["response_tokens"] == tokens
    assert masked.metrics["truncated_masked_frac"] == 0.25
    assert masked.metrics["zero_adv_skipped_frac"] == 0.0  # masked rows are not skips
    loss_all, tokens_all = _expected(list(range(8)))
    assert everything.metrics["loss"] == pytest.approx(loss_all, abs=1e-5)
    assert everything.metrics["response_tokens"] == tokens_all
    assert "truncated_masked_frac" not in everything.metrics
    assert abs(loss - loss_all) > 1e-3  # the two differ: the check above can fail


def test_groups_that_only_fill_a_short_batch_add_nothing() -> None:
    short = _train(False, [True, False])  # dynamic sampling kept the first group only
    loss, tokens = _expected([0, 1, 2, 3])
    assert short.metrics["loss"] == pytest.approx(loss, abs=1e-5)
    assert short.metrics["response_tokens"] == tokens
    assert short.metrics["zero_adv_skipped_frac"] == 0.0  # filling rows are not skips
    assert torch.isfinite(torch.tensor(short.metrics["grad_norm"]))
