"""The RL step's optimisation machinery on the built-in tiny models (fast, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.rl_helpers import (
    GROUP,
    PROMPTS,
    FixedRollout,
    GradCapturingEngine,
    LengthParityReward,
    tiny_step,
)


def _setup(model_name: str, algorithm: str, micro: int = 0, seed: int = 0):  # type: ignore[no-untyped-def]
    model, tokenizer = create_builtin(model_name, seed=seed)
    recipe = Recipe.model_validate(
        {"algorithm": {"name": algorithm, "minibatches": 2}, "optimizer": {"lr": 1e-3}}
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=12, num_samples=GROUP)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer, micro_batch_size=micro)
    return model, tokenizer, GradCapturingEngine(model, engine_settings(recipe), LOCAL), settings


def _step(engine, rollout, settings, seed: int = 0):  # type: ignore[no-untyped-def]
    rows = [{"prompt": "p", "answer": "0"}] * len(PROMPTS)
    return rl_step(
        StepModels(engine),
        rollout,
        LengthParityReward(),
        PROMPTS,
        rows,
        settings,
        seed,
    )


@pytest.mark.parametrize(
    "model_name,algorithm",
    [
        ("tiny-dense", "gspo"),
        ("tiny-dense", "gspo_token"),
        ("tiny-dense", "grpo"),
        ("tiny-moe", "gspo"),
    ],
)
def test_a_few_steps_change_every_parameter_with_finite_metrics(
    model_name: str, algorithm: str
) -> None:
    torch.manual_seed(0)
    model, tokenizer, engine, settings = _setup(model_name, algorithm)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = HFGenerateEngine(model, tokenizer)
    for step in range(3):
        out = _step(engine, rollout, settings, seed=step)
        assert all(math.isfinite(v) for v in out.metrics.values()), out.metrics
        assert out.metrics["grad_norm"] > 0
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []


@pytest.mark.parametrize("algorithm", ["gspo", "grpo"])
def test_gradient_accumulation_equals_one_big_batch(algorithm: str) -> None:
    torch.manual_seed(1)
    model, tokenizer, _, _ = _setup("tiny-dense", algorithm)
    fixed = FixedRollout(
        HFGenerateEngine(model, tokenizer).generate(
            PROMPTS, SamplingParams(max_new_tokens=12, num_samples=GROUP)
        )
    )
    finals = []
    for micro in (0, 2):  # whole minibatch of 8 at once, or 4 micro-batches of 2
        model, _, engine, settings = _setup("tiny-dense", algorithm, micro=micro)
        out = _step(engine, fixed, settings)
        finals.append((engine.grads, out.metrics))
    (g_big, m_big), (g_acc, m_acc) = finals
    assert len(g_big) == len(g_acc) == 2  # one optimiser step per minibatch
    # The first minibatch starts from identical weights: its gradient must match. (Later ones
    # start after an Adam step, which magnifies float rounding in near-zero gradients.)
    for name in g_big[0]:
        torch.testing.assert_close(g_big[0][name], g_acc[0][name], rtol=1e-3, atol=1e-6)
    assert m_big["grad_norm"] == pytest.approx(m_acc["grad_norm"], rel=1e-3)
