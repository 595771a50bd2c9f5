"""Tool trajectories with vLLM rollouts: the interpreter's results appended between the engine's
turns, and the engine's log-probs of the model's tokens equal the trainer's with the tool
tokens as context."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from gspo_cli.data import render_prompt
from gspo_cli.models import load_policy
from gspo_cli.models.forward.batch import pad_logprobs
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.recipe import load_recipe
from gspo_cli.rollout.base import EngineSpec, SamplingParams
from gspo_cli.rollout.engines import make_rollout_engine
from gspo_cli.train.step.train_batch import build_train_batch, check_sampled_ids
from tests.support.helpers import cold_start, shared_root, write_recipe

# tests/integration/train/test_tool_training.py's cold start: `make test` trains it once for
# both suites (tests/support/helpers.py `shared_root`)
TOOL_TASK = {
    "data": {"arithmetic": {"tool_rate": 1.0, "unboxed_rate": 0.0}},
    "rollout": {"max_new_tokens": 64, "tools": {"output_max_tokens": 16, "max_calls": 2}},
    "cold_start": {"enabled": True, "steps": 200, "lr": 3e-3, "batch_size": 16},
}


def test_vllm_tool_trajectories_keep_the_engines_ids_and_log_probs(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    recipe = load_recipe(write_recipe(tmp_path, TOOL_TASK))
    model, tokenizer = load_policy(str(cold_start(shared_root(tmp_path_factory), TOOL_TASK)))
    spec = EngineSpec(
        model, tokenizer, model.state_dict().items, seed=0, tools=recipe.tool_settings()
    )
    engine = make_rollout_engine("vllm", spec)
    turns: list[str] = []  # each model turn as vLLM returned it
    inner = engine.engine  # type: ignore[attr-defined]
    generate = inner.generate

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = generate(*args, **kwargs)
        turns.extend(tokenizer.decode(ids) for ids in out.completion_ids)
        return out

    inner.generate = recorded
    try:
        questions = [f"Compute {a}+{b}." for a, b in ((3, 4), (12, 9), (7, 8))]
        prompts = [render_prompt(tokenizer, q, recipe.data) for q in questions]
        params = SamplingParams(1.0, 1.0, 0, 64, 4, logprobs=True)
        rollout = engine.generate(prompts, params, seeds=[1, 2, 3])
    finally:
        engine.close()
    assert rollout.tool_traces is not None and rollout.from_tool is not None
    assert sum(t.calls for t in rollout.tool_traces) > 0  # the model called the interpreter
    assert any("```output\n" in t for t in rollout.texts)
    # vLLM's stop strings end a calling turn at its fence, not at the budget
    calling = [t for t in turns if "```python" in t]
    assert calling and any(t.endswith("```\n") for t in calling)
    batch = build_train_batch(rollout, int(tokenizer.pad_token_id))
    check_sampled_ids(batch, rollout)
    assert (batch.response_mask.sum() < batch.attention_mask[:, batch.prompt_width :].sum()).item()
    with torch.no_grad():
        trainer, _ = response_logprobs(model, batch, 1.0)
    assert rollout.completion_logprobs is not None
    engine_lp = pad_logprobs(rollout.completion_logprobs, batch.response_mask.shape[1])
    gap = float(((trainer - engine_lp).abs() * batch.response_mask).max())
    assert gap < 1e-5  # the same law, the tool tokens context in both
