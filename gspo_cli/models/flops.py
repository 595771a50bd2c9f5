"""Model FLOPs: what a causal LM's forward computes per token, counted from its config (the
numerator of MFU, model FLOPs utilisation).

Counted: every matrix multiply of the model, at 2 FLOPs per multiply-add. Per token and layer the
attention projections (q, k, v, o) and the gated feed-forward (gate, up, down: Llama, Qwen,
Mistral), with Mixture-of-Experts layers at their ACTIVE experts only (`num_experts_per_tok`
experts, plus the router and a shared expert where the model has one); the attention itself
(q.k over the keys a token attends to, then the weighted sum of values) at its causal context;
and the LM head where a log-prob is needed. Not counted: embeddings (a lookup), norms,
activations, softmax, rotary embeddings, biases and residual adds (elementwise work, a fraction
of a percent at these widths).

A response row of prompt length P and response length R costs the same forward in generation as
in training: the body runs over the P + R - 1 tokens whose hidden states feed a prediction (the
last response token is never fed back) and the head over the R positions that predict a response
token. Each row counts on its own: where an engine runs a group's shared prompt once, the model
is credited with the prompt of every row (as MFU counts model work, not the work a saving skips).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class FlopShape:
    """A model's FLOPs per token, from `flop_shape`."""

    body: int  # forward FLOPs of the layers' weight matmuls per token
    head: int  # forward FLOPs of the LM head per position that needs logits
    attention: int  # forward FLOPs per token per key position it attends to (all layers)

    def forward(self, start: int, end: int, head_positions: int) -> int:
        """Forward FLOPs of the tokens at positions [start, end) of one causal sequence (the
        token at position i attends to i + 1 keys, the cached ones included), with the head on
        `head_positions` of them."""
        if end <= start:
            return self.head * head_positions
        keys = (end * (end + 1) - start * (start + 1)) // 2  # sum of i + 1 over [start, end)
        return self.body * (end - start) + self.attention * keys + self.head * head_positions

    def row(self, prompt_len: int, response_len: int) -> int:
        """Forward FLOPs of one response row, in generation or in a training forward (above)."""
        return self.forward(0, prompt_len + response_len - 1, response_len)


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _sparse_layers(config: Any, layers: int) -> list[bool]:
    """Which layers are Mixture-of-Experts ones (Qwen's decoder_sparse_step and
    mlp_only_layers; Mixtral: every layer)."""
    if not _get(config, "num_experts", "num_local_experts", default=0):
        return [False] * layers
    step = int(_get(config, "decoder_sparse_step", default=1)) or 1
    dense_only = set(_get(config, "mlp_only_layers", default=[]))
    return [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]


def flop_shape(config: Any) -> FlopShape:
    """Per-token FLOPs of an HF causal-LM config (Llama, Qwen2/3, Qwen3-MoE, Mixtral names; a
    multimodal model's `text_config`). See the module docstring for what is counted."""
    config = _get(config, "text_config", default=config)
    d, layers = int(config.hidden_size), int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=d // heads))
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    attn_weights = d * q_width + 2 * d * kv_width + q_width * d  # q, k, v, o
    dense_mlp = 3 * d * int(config.intermediate_size)  # gate, up, down
    experts = int(_get(config, "num_experts", "num_local_experts", default=0))
    active = int(_get(config, "num_experts_per_tok", default=0))
    expert_width = int(_get(config, "moe_intermediate_size", default=config.intermediate_size))
    shared = int(_get(config, "shared_expert_intermediate_size", default=0))
    moe_mlp = d * experts + active * 3 * d * expert_width  # router, active experts
    if shared:
        moe_mlp += 3 * d * shared + d  # the shared expert and its gate
    weights = sum(
        attn_weights + (moe_mlp if sparse else dense_mlp)
        for sparse in _sparse_layers(config, layers)
    )
    return FlopShape(
        body=2 * weights,
        head=2 * d * int(config.vocab_size),
        attention=2 * 2 * layers * q_width,  # q.k and the values' sum, per key
    )


def rollout_flops(
    shape: FlopShape, prompt_ids: list[list[int]], completions: list[list[int]]
) -> int:
    """Generation FLOPs of a rollout batch: prefill and decoding of every row."""
    return sum(shape.row(len(p), len(c)) for p, c in zip(prompt_ids, completions, strict=True))


def train_flops(
    shape: FlopShape,
    lengths: list[tuple[int, int]],
    trained: list[int],
    extra_forwards: list[list[int]],
    frozen_base: bool = False,
) -> int:
    """Training FLOPs of a step over rows of (prompt, response) `lengths`: each `trained` row's
    forward and backward, and one forward per row of each no-grad pass in `extra_forwards`
    (pi_old recomputed, the reference policy).

    The backward is 2 forwards (the gradients of the activations and of the weights), so a
    trained row costs 3. With a `frozen_base` (LoRA) the weights take no gradient: the weight
    matmuls' backward is 1 forward, the attention's still 2 (the gradients of q, k and v); the
    adapters' own FLOPs are left out."""
    per_row = [shape.row(p, r) for p, r in lengths]
    total = 3 * sum(per_row[i] for i in trained)
    if frozen_base:
        attention_only = replace(shape, body=0, head=0)
        weights = sum(per_row[i] - attention_only.row(*lengths[i]) for i in trained)
        total -= weights  # no weight gradients
    return total + sum(per_row[i] for rows in extra_forwards for i in rows)
