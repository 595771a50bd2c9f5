"""Built-in tiny models, created offline from configs: `builtin:tiny-dense`, `builtin:tiny-moe`.

Both use the Qwen3 architecture family (dense and Mixture-of-Experts) so that everything the
trainer does on them carries over to real Qwen3 checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from gspo_cli.core.registry import Registry
from gspo_cli.models.tokenizer import build_char_tokenizer

BUILTIN_MODEL_PREFIX = "builtin:"  # builtin:tiny-dense, parsed by models.loading

BUILTIN_MODELS: Registry[Callable[[PreTrainedTokenizerFast], PreTrainedModel]] = Registry(
    "built-in model"
)

_SHARED = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def _token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": int(tokenizer.pad_token_id),
        "eos_token_id": int(tokenizer.eos_token_id),
        "bos_token_id": int(tokenizer.convert_tokens_to_ids("<|im_start|>")),
    }


@BUILTIN_MODELS.register("tiny-dense")
def tiny_dense(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """Qwen3 architecture, 4 layers x 128 wide (about 0.8M parameters)."""
    config = Qwen3Config(intermediate_size=384, **_SHARED, **_token_ids(tokenizer))
    return Qwen3ForCausalLM(config)


def _qwen3_moe(
    tokenizer: PreTrainedTokenizerFast, layers: int, experts: int, expert_width: int
) -> PreTrainedModel:
    """A Qwen3-MoE of the shared width with top-2 routing."""
    config = Qwen3MoeConfig(
        intermediate_size=384,
        moe_intermediate_size=expert_width,
        num_experts=experts,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        **{**_SHARED, "num_hidden_layers": layers},
        **_token_ids(tokenizer),
    )
    return Qwen3MoeForCausalLM(config)


@BUILTIN_MODELS.register("tiny-moe")
def tiny_moe(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """Qwen3-MoE architecture: 4 layers, 8 experts per layer, top-2 routing."""
    return _qwen3_moe(tokenizer, layers=4, experts=8, expert_width=128)


@BUILTIN_MODELS.register("tiny-moe-deep")
def tiny_moe_deep(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """Qwen3-MoE, 8 layers of 16 experts, top-2 (recipes/paper/): deep and wide enough for
    routing to matter, small enough to train on 2 CPU cores."""
    return _qwen3_moe(tokenizer, layers=8, experts=16, expert_width=64)


def create_builtin(name: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A freshly initialised built-in model (seeded) and its offline tokenizer."""
    tokenizer = build_char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BUILTIN_MODELS.get(name)(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer
