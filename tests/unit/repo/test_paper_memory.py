"""scripts/paper_memory.py: parameter counts against a real model, ZeRO and EP partitioning by
hand, and its model states against DeepSpeed's own estimators."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

REPO = Path(__file__).resolve().parents[3]
# ZeRO-2 is the same formula as DeepSpeed's (2 + 18 / GPUs bytes per parameter); ZeRO-3 differs
# by design: DeepSpeed counts 18 bytes per parameter partitioned, the script 16 plus one float32
# gradient sub-group, so the 30B figures may part by up to 10%.
ZERO2_TOLERANCE, ZERO3_TOLERANCE = 1e-9, 0.10


@functools.cache
def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "paper_memory", REPO / "scripts" / "paper_memory.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tiny_config(tied: bool = False) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=97, hidden_size=16, intermediate_size=40, moe_intermediate_size=12,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
        num_experts=8, num_experts_per_tok=2, tie_word_embeddings=tied,
    )  # fmt: skip


@pytest.mark.parametrize("tied", [False, True])
def test_params_match_a_real_model(tied: bool) -> None:
    script, config = load_script(), tiny_config(tied)
    model = Qwen3MoeForCausalLM(config)
    counts = script.count_params(config)
    assert counts.total == sum(p.numel() for p in model.parameters())
    experts = [m for name, m in model.named_modules() if name.endswith("mlp.experts")]
    assert len(experts) == config.num_hidden_layers
    assert counts.expert == sum(p.numel() for m in experts for p in m.parameters())
    assert counts.expert_module == sum(p.numel() for p in experts[0].parameters())
    one_expert = counts.expert_module // config.num_experts
    idle = config.num_experts - config.num_experts_per_tok
    assert counts.active == counts.total - config.num_hidden_layers * idle * one_expert


def test_zero_and_ep_partitioning_by_hand() -> None:
    script = load_script()
    counts = script.count_params(tiny_config())
    total, expert, gpus = counts.total, counts.expert, 4
    zero0 = script.model_states(counts, 0, 1, gpus)
    assert zero0["weights"] == 2 * total and zero0["master+adam"] == 12 * total
    assert zero0["grads"] == 6 * total and zero0["gathered"] == 0
    # ZeRO-3 divides every model state by the world size (fp32 gradients: a sub-group of it).
    zero3 = script.model_states(counts, 3, 1, gpus)
    assert zero3["weights"] == 2 * total / gpus and zero3["master+adam"] == 12 * total / gpus
    assert zero3["grads"] == 6 * total / gpus  # the whole partition is below one sub-group
    assert zero3["gathered"] == 4 * max(counts.expert_module, counts.embedding)
    # EP divides the experts' share of what ZeRO leaves whole, and ZeRO-3's gathered experts.
    for ep in (2, 4):
        split = script.model_states(counts, 0, ep, gpus)
        assert split["weights"] == 2 * (total - expert + expert / ep)
        assert split["master+adam"] == 12 * (total - expert + expert / ep)
        partitioned = script.model_states(counts, 3, ep, gpus)
        assert partitioned["master+adam"] == zero3["master+adam"]
        assert partitioned["gathered"] == 4 * max(counts.expert_module / ep, counts.embedding)
    with pytest.raises(ValueError):
        script.model_states(counts, 0, 3, gpus)


def test_zero3_states_fit_and_the_kv_cache_by_hand() -> None:
    script = load_script()
    config = script.qwen3_30b_a3b_config()
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    assert script.kv_bytes_per_token(config) == per_token
    recipe = script.load_recipe(script.RECIPE)
    lengths = script.recipe_lengths(recipe)
    rows = recipe.rollout.num_prompts * recipe.rollout.group_size
    tokens = recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens
    assert script.kv_cache_bytes(config, lengths, 8) == rows / 8 * tokens * per_token
    assert lengths.micro_tokens == recipe.trainer.micro_batch_size * tokens


@pytest.mark.parametrize("gpus", [8, 16])
def test_model_states_match_deepspeed(gpus: int) -> None:
    script = load_script()
    counts = script.count_params(script.qwen3_30b_a3b_config())
    theirs = script.deepspeed_estimates(counts, gpus)
    for stage, tolerance in ((2, ZERO2_TOLERANCE), (3, ZERO3_TOLERANCE)):
        ours = sum(script.model_states(counts, stage, 1, gpus).values())
        assert ours == pytest.approx(theirs[stage][0], rel=tolerance)
        assert "offload_optimizer=none" in theirs[stage][1]
