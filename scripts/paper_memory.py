"""Memory per GPU at the paper's scale, on paper: Qwen3-30B-A3B trained with the lengths and
batch of recipes/deepspeed/paper-qwen3-30b-a3b.yaml, per ZeRO stage and expert parallelism.

Counted from the model's config (no weights, nothing downloaded) and the recipe read with
gspo_cli's own loader. Bytes per parameter, as DeepSpeed's bf16 mixed precision keeps them:
weights 2 (bf16), gradients 2 (bf16) + 4 (fp32, the optimiser's partition), fp32 master 4,
AdamW's two states 8 (ZeRO-3 holds the fp32 gradients one sub-group at a time). ZeRO-1
partitions the fp32 master, Adam states and fp32 gradients over the GPUs, ZeRO-2 the bf16
gradients too, ZeRO-3 the bf16 weights too (and gathers one module at a time: 4 bytes x its
parameters, as DeepSpeed counts). Expert parallelism EP = e gives each GPU
1/e of the experts; ZeRO then partitions them over the GPUs/e ranks holding the same experts.
Activations: the recipe's micro-batch (rows x (prompt + response) tokens) x a per-layer count
of kept values derived below from the config. Logits: float32 over the response tokens, as
gspo_cli/recipe/bounds.py counts them. KV cache: each rank generates its share of the
num_prompts x group_size rows at prompt + max_new_tokens tokens, K and V in bf16. The figures
are then checked against DeepSpeed's own model-state estimators.

    .venv/bin/python scripts/paper_memory.py [--gpus 8] [--capacity-gib 80]
"""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import Qwen3MoeConfig

from gspo_cli.recipe import Recipe, load_recipe
from gspo_cli.recipe.bounds import LOGIT_BYTES

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "deepspeed" / "paper-qwen3-30b-a3b.yaml"
GIB = 1024**3
BF16 = 2
STAGES = (0, 1, 2, 3)
EP_SIZES = (1, 2, 4, 8)
# DeepSpeed's zero_optimization.sub_group_size default: ZeRO-3 turns one sub-group of its
# gradient partition into float32 at a time during the optimiser step, then frees it.
SUB_GROUP = 10**9


def qwen3_30b_a3b_config() -> Qwen3MoeConfig:
    """Qwen/Qwen3-30B-A3B's public config.json sizes (every layer MoE; intermediate_size 6144
    is used by no layer, as decoder_sparse_step 1 and no mlp_only_layers make all layers MoE)."""
    return Qwen3MoeConfig(
        vocab_size=151_936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=40_960, tie_word_embeddings=False, norm_topk_prob=True,
    )  # fmt: skip


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int  # what one token passes through: top-k experts, attention, embeddings
    expert: int  # the routed experts' weights, the share expert parallelism splits
    expert_module: int  # one layer's fused experts module (ZeRO-3 gathers it whole)
    embedding: int  # the largest other module: the embedding (the LM head is the same size)


def count_params(config: Any) -> ParamCounts:
    """Parameters of a Qwen3-MoE model from its config (all layers MoE, no attention bias)."""
    if config.decoder_sparse_step != 1 or config.mlp_only_layers:
        raise ValueError("only all-MoE Qwen3-MoE configs are counted here")
    h, d, layers = config.hidden_size, config.head_dim, config.num_hidden_layers
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    attention = h * q + 2 * h * kv + q * h + 2 * d  # q, k, v, o and the q/k RMSNorms
    dense_layer = attention + 2 * h + config.num_experts * h  # two RMSNorms, the router
    one_expert = 3 * h * config.moe_intermediate_size  # gate, up and down projections
    embedding = config.vocab_size * h
    outer = embedding * (1 if config.tie_word_embeddings else 2) + h  # and the final norm
    return ParamCounts(
        total=outer + layers * (dense_layer + config.num_experts * one_expert),
        active=outer + layers * (dense_layer + config.num_experts_per_tok * one_expert),
        expert=layers * config.num_experts * one_expert,
        expert_module=config.num_experts * one_expert,
        embedding=embedding,
    )


def layer_values_per_token(config: Any) -> int:
    """Values one layer keeps per token for backward (16-bit each), with flash/SDPA attention
    (no seq x seq scores) and no dropout: the dense count of recipe/bounds.py does not fit MoE,
    where each token's hidden state is copied to k experts."""
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    attention = h + (q + 2 * kv) + (q + kv) + q  # normed input, q/k/v, q/k norm inputs, output
    norms = 2 * h  # the two RMSNorms' inputs
    per_expert = 2 * h + 3 * config.moe_intermediate_size  # input copy, gate+up, act, output
    router = h + 2 * config.num_experts  # normed input, float32 logits
    return attention + norms + router + config.num_experts_per_tok * per_expert


@dataclass(frozen=True)
class Lengths:
    micro_rows: int
    micro_tokens: int
    response_tokens: int  # through the LM head per micro-batch
    rows: int  # num_prompts x group_size per step
    row_tokens: int  # prompt + max_new_tokens
    checkpointing: bool


def recipe_lengths(recipe: Recipe) -> Lengths:
    """The training micro-batch and rollout sizes a recipe sets (as recipe/bounds.py reads it)."""
    rollout, trainer = recipe.rollout, recipe.trainer
    rows = rollout.num_prompts * rollout.group_size
    row_tokens = recipe.data.max_prompt_tokens + rollout.max_new_tokens
    micro_rows = trainer.micro_batch_size or rows // recipe.algorithm.minibatches
    micro_tokens, response_tokens = micro_rows * row_tokens, micro_rows * rollout.max_new_tokens
    if trainer.max_tokens_per_micro_batch:
        micro_tokens = min(micro_tokens, trainer.max_tokens_per_micro_batch)
        response_tokens = min(response_tokens, trainer.max_tokens_per_micro_batch)
    return Lengths(
        micro_rows, micro_tokens, response_tokens, rows, row_tokens,
        recipe.model.gradient_checkpointing,
    )  # fmt: skip


def model_states(params: ParamCounts, stage: int, ep: int, gpus: int) -> dict[str, float]:
    """Bytes per GPU of weights, gradients, fp32 master + AdamW and ZeRO-3's gathered module."""
    if gpus % ep:
        raise ValueError(f"EP {ep} must divide the {gpus} GPUs")
    dense = params.total - params.expert

    def held(partitioned: bool) -> float:
        # Experts: 1/ep of them per GPU, partitioned over the gpus/ep ranks that share them.
        return (dense + params.expert) / gpus if partitioned else dense + params.expert / ep

    gathered = max(params.expert_module / ep, params.embedding) if stage == 3 else 0
    fp32_grads = min(SUB_GROUP, held(True)) if stage == 3 else held(stage >= 1)
    return {
        "weights": BF16 * held(stage >= 3),
        "grads": BF16 * held(stage >= 2) + 4 * fp32_grads,
        "master+adam": (4 + 8) * held(stage >= 1),
        "gathered": 4 * gathered,
    }


def activation_bytes(config: Any, lengths: Lengths) -> dict[str, float]:
    """Activations kept for backward (each layer's input with checkpointing, plus one layer's
    full set while it is recomputed), the LM head's float32 logits, per GPU."""
    full, layers = layer_values_per_token(config), config.num_hidden_layers
    kept = layers * config.hidden_size + full if lengths.checkpointing else layers * full
    return {
        "activations": lengths.micro_tokens * kept * BF16,
        "logits": lengths.response_tokens * config.vocab_size * LOGIT_BYTES,
    }


def kv_bytes_per_token(config: Any) -> int:
    """K and V of every layer for one token, bf16."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * BF16


def kv_cache_bytes(config: Any, lengths: Lengths, gpus: int) -> float:
    """The colocated rollout engine's cache: this rank's share of the step's rows, full length."""
    return lengths.rows / gpus * lengths.row_tokens * kv_bytes_per_token(config)


def deepspeed_estimates(params: ParamCounts, gpus: int) -> dict[int, tuple[float, str]]:
    """DeepSpeed's own per-GPU model-state estimates (no offload) for ZeRO-2 and ZeRO-3, and the
    line its `_all_cold` printer shows for that setting (zero_init=1). Largest layer: the module
    ZeRO-3 gathers, the fused experts module (as its `model_to_params` would find)."""
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    largest = max(params.expert_module, params.embedding)
    zero2 = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        params.total, num_gpus_per_node=gpus, cpu_offload=False
    )[1]
    zero3 = stage3.estimate_zero3_model_states_mem_needs(
        params.total, largest, num_gpus_per_node=gpus, cpu_offload=False,
        cpu_offload_params=False, zero_init=True,
    )[1]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold(params.total, gpus)
        stage3.estimate_zero3_model_states_mem_needs_all_cold(params.total, largest, gpus)
    lines = [line for line in printed.getvalue().splitlines() if "offload_optimizer=none" in line]
    return {2: (float(zero2), lines[0].strip()), 3: (float(zero3), lines[-2].strip())}


def rollout_room(
    config: Any, lengths: Lengths, params: ParamCounts, gpus: int, capacity_gib: float
) -> str:
    """How many full-length rows' KV fits beside ZeRO-3's model states while generating
    (training activations freed by then)."""
    states = sum(model_states(params, 3, 1, gpus).values())
    row = lengths.row_tokens * kv_bytes_per_token(config)
    fit = max(0, int((capacity_gib * GIB - states) // row))
    return (
        f"Rollout phase, ZeRO-3 EP 1: {states / GIB:.1f} GiB of model states leave room for "
        f"{fit} full-length rows' KV cache ({row / GIB:.2f} GiB each) of the "
        f"{lengths.rows // gpus} per GPU: generate in chunks of at most that many."
    )


def table_rows(
    config: Any, lengths: Lengths, gpus: int, capacity_gib: float
) -> list[dict[str, Any]]:
    """One row per ZeRO stage x EP: GiB per GPU by component, totals and whether they fit."""
    params, rows = count_params(config), []
    extra = activation_bytes(config, lengths)
    kv = kv_cache_bytes(config, lengths, gpus)
    for stage in STAGES:
        for ep in EP_SIZES:
            parts = {**model_states(params, stage, ep, gpus), **extra}
            train = sum(parts.values())
            row: dict[str, Any] = {"zero": stage, "ep": ep}
            row.update({name: value / GIB for name, value in parts.items()})
            row.update(train=train / GIB, kv=kv / GIB, with_kv=(train + kv) / GIB)
            row.update(fits=train / GIB <= capacity_gib, fits_kv=(train + kv) / GIB <= capacity_gib)
            rows.append(row)
    return rows


COLUMNS = (
    ("zero", "ZeRO", "{}"), ("ep", "EP", "{}"), ("weights", "weights", "{:.1f}"),
    ("grads", "grads", "{:.1f}"), ("master+adam", "master+Adam", "{:.1f}"),
    ("gathered", "gathered", "{:.1f}"), ("activations", "activ.", "{:.1f}"),
    ("logits", "logits", "{:.1f}"), ("train", "train", "{:.1f}"), ("fits", "fits", "{}"),
    ("kv", "KV", "{:.1f}"), ("with_kv", "+KV", "{:.1f}"), ("fits_kv", "fits", "{}"),
)  # fmt: skip


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table, GiB per GPU."""
    cells = [[header for _, header, _ in COLUMNS]]
    for row in rows:
        cells.append(
            [
                ("yes" if row[key] else "no") if key.startswith("fits") else fmt.format(row[key])
                for key, _, fmt in COLUMNS
            ]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        " ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells
    )


def report(recipe_path: Path, gpus: int, capacity_gib: float) -> str:
    """The whole printout: sizes, the table and the DeepSpeed comparison."""
    config, recipe = qwen3_30b_a3b_config(), load_recipe(recipe_path)
    lengths, params = recipe_lengths(recipe), count_params(config)
    factor = layer_values_per_token(config) / config.hidden_size
    mode = "on (each layer's input kept)" if lengths.checkpointing else "off"
    lines = [
        f"Qwen3-30B-A3B: {params.total / 1e9:.2f}B parameters, {params.active / 1e9:.2f}B active, "
        f"{params.expert / 1e9:.2f}B in routed experts; {gpus} GPUs of {capacity_gib:g} GiB.",
        f"Recipe {recipe_path.name}: micro-batch {lengths.micro_rows} rows x "
        f"{lengths.row_tokens} tokens = {lengths.micro_tokens}; gradient checkpointing {mode}; "
        f"per-layer factor {factor:.1f} x hidden values per token (bf16).",
        f"Rollout: {lengths.rows} rows x {lengths.row_tokens} tokens, "
        f"{kv_bytes_per_token(config) / 1024:.0f} KiB of KV per token, "
        f"{lengths.rows // gpus} rows per GPU.",
        "GiB per GPU ('train': model states + activations + logits; '+KV': with the rollout "
        "engine's whole KV cache resident):",
        format_table(table_rows(config, lengths, gpus, capacity_gib)),
        rollout_room(config, lengths, params, gpus, capacity_gib),
        "DeepSpeed's estimators (EP 1, no offload; model states only):",
    ]
    for stage, (theirs, printed) in deepspeed_estimates(params, gpus).items():
        ours = sum(model_states(params, stage, 1, gpus).values())
        lines.append(
            f"  ZeRO-{stage}: here {ours / GIB:.2f} GiB, DeepSpeed {theirs / GIB:.2f} GiB "
            f"(relative difference {abs(ours - theirs) / theirs:.1e}); its printer: {printed}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--capacity-gib", type=float, default=80.0)
    args = parser.parse_args()
    print(report(args.recipe, args.gpus, args.capacity_gib))


if __name__ == "__main__":
    main()
