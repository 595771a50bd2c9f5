"""Small randomly initialised causal LMs of any transformers family, for tests that compare
two ways of computing the same thing on it."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel


def small_causal_lm(model_type: str, vocab: int, **config: Any) -> PreTrainedModel:
    """Two layers, hidden size 64, 4 heads over 2 key/value heads, seeded weights."""
    settings: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "vocab_size": vocab,
    }
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings | config))
