"""Hardware use of a short RL-like step: counted model FLOPs, seconds and MFU of its rollout and
training phases against the machine's measured fp32 matmul peak, one torch thread.

For three model shapes with random weights (nothing downloaded): builtin:tiny-dense, the Qwen3
dense 103M of benchmarks/vs_trl/shapes.py (vocab 151,936) and SmolLM2-135M's Llama shape (576
wide, 30 layers, 9 heads, 3 KV heads, 1536 intermediate, vocab 49,152, tied embeddings). The step:
generate ROWS x NEW_TOKENS tokens after PROMPT_TOKENS-token prompts (prefill, then a KV-cached
decoding loop, sampled), then one training forward and backward over the full rows (the response
log-probs' sum as the loss). FLOPs are gspo_cli/models/flops.py's count, the same the trainer
logs; the peak is measured here (fp32 `torch.mm`, best of a few) beside the cached one the trainer
uses. Rounds go model by model, interleaved; the best round of each is printed.

    .venv/bin/python benchmarks/hardware_use.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gspo_cli.models import create_builtin
from gspo_cli.models.flops import flop_shape, rollout_flops, train_flops
from gspo_cli.train.engines.hardware import measure_matmul_peak, peak_flops, peak_key

ROWS, PROMPT_TOKENS, NEW_TOKENS = 8, 16, 64


def dense_103m() -> Any:
    """benchmarks/vs_trl/shapes.py's dense-103m (its config, without the word tokenizer)."""
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=151_936, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
            num_attention_heads=8, num_key_value_heads=4, head_dim=64,
            max_position_embeddings=4096, tie_word_embeddings=True,
        )
    )  # fmt: skip


def smollm2_135m() -> Any:
    """SmolLM2-135M's shape (its config.json's sizes), random weights."""
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
            tie_word_embeddings=True, rope_theta=100_000.0,
        )
    )  # fmt: skip


MODELS = {
    "tiny-dense": lambda: create_builtin("tiny-dense", seed=0)[0],
    "dense-103m": dense_103m,
    "smollm2-135m shape": smollm2_135m,
}


def generate(model: Any, prompts: torch.Tensor) -> torch.Tensor:
    """`[ROWS, NEW_TOKENS]` sampled tokens: one prefill, then one cached step per token."""
    out = model(prompts, use_cache=True, logits_to_keep=1)  # the head where it predicts
    cache, tokens = out.past_key_values, []
    for _ in range(NEW_TOKENS):
        token = torch.multinomial(out.logits[:, -1].float().softmax(-1), 1)  # [ROWS, 1]
        tokens.append(token)
        if len(tokens) < NEW_TOKENS:  # the last token is sampled, never fed back
            out = model(token, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    return torch.cat(tokens, dim=1)


def train_pass(model: Any, rows: torch.Tensor) -> None:
    """One forward and backward over `rows` `[ROWS, P + R]`: the response tokens' log-probs."""
    logits = model(rows[:, :-1], logits_to_keep=NEW_TOKENS).logits  # [ROWS, R, V]
    targets = rows[:, PROMPT_TOKENS:]  # [ROWS, R]
    logprobs = logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1))
    logprobs.sum().backward()
    model.zero_grad(set_to_none=True)


def one_round(model: Any) -> tuple[float, float]:
    """Seconds of the rollout and of the training pass."""
    vocab = model.config.vocab_size
    prompts = torch.randint(0, vocab, (ROWS, PROMPT_TOKENS), generator=torch.Generator())
    start = time.perf_counter()
    with torch.no_grad():
        responses = generate(model.eval(), prompts)
    rollout_s = time.perf_counter() - start
    start = time.perf_counter()
    train_pass(model.train(), torch.cat([prompts, responses], dim=1))
    return rollout_s, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    models = {name: build() for name, build in MODELS.items()}
    best: dict[str, tuple[float, float]] = {}
    peak = 0.0
    for _ in range(args.rounds):
        peak = max(peak, measure_matmul_peak(cpu))  # in every round: the best, as the times
        for name, model in models.items():
            times = one_round(model)
            old = best.get(name, (float("inf"), float("inf")))
            best[name] = (min(old[0], times[0]), min(old[1], times[1]))
    print(f"machine: {peak_key(cpu)}")
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s measured here (best of the rounds), "
          f"{peak_flops(cpu) / 1e9:.1f} GFLOP/s in the cache (what training logs)")  # fmt: skip
    print(f"\n{ROWS} rows x ({PROMPT_TOKENS} prompt + {NEW_TOKENS} generated tokens), "
          f"best of {args.rounds} rounds, 1 torch thread\n")  # fmt: skip
    print("| model | params | rollout GFLOP | rollout s | MFU rollout "
          "| train GFLOP | train s | MFU train |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    lengths = [(PROMPT_TOKENS, NEW_TOKENS)] * ROWS
    for name, model in models.items():
        shape = flop_shape(model.config)
        ids = [[0] * PROMPT_TOKENS] * ROWS, [[0] * NEW_TOKENS] * ROWS
        flops = rollout_flops(shape, *ids), train_flops(shape, lengths, list(range(ROWS)), [])
        (rollout_s, train_s), params = best[name], sum(p.numel() for p in model.parameters())
        print(f"| {name} | {params / 1e6:.1f}M | {flops[0] / 1e9:.2f} | {rollout_s:.2f} "
              f"| {flops[0] / (rollout_s * peak):.1%} | {flops[1] / 1e9:.2f} | {train_s:.2f} "
              f"| {flops[1] / (train_s * peak):.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
