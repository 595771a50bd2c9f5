"""Does DeepSpeed AutoEP (expert parallelism for HF MoE models) train on CPU with gloo?

A tiny Qwen3-MoE (8 experts, top-2), `deepspeed.initialize` with `expert_parallel` at
`autoep_size` = EP (0: no AutoEP), then `--steps` forward + backward + optimizer steps, each
rank on its own batch. Run it with

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/autoep_cpu_probe.py \
        [--ep 2] [--zero 2] [--steps 3] [--clip 1.0]

Rank 0 prints the rank-mean loss and global gradient norm per step and `PROBE OK`; a failure is
DeepSpeed's traceback, unfiltered. With the same seeds every EP (and --ep 0) sees the same global
batch, so the lines of two runs compare directly. Standalone: gspo_cli is not imported.

Found with DeepSpeed 0.19.8, torch 2.13 (CPU): EP 2 runs on gloo at ZeRO 0, 2 and 3 and matches
EP 1 and no AutoEP to float rounding, except ZeRO-0 with clipping active (its fp32 clip averages
the ranks' local norms, each over its own experts: runtime/utils.py clip_grad_norm_). An
optimizer built before `initialize` fails at ZeRO 1-2 (no 'moe' param group), hence the callable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed: no GPU probe and warning

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.moe.utils import configure_moe_param_groups
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def tiny_moe() -> Qwen3MoeForCausalLM:
    """The shape of gspo's builtin:tiny-moe, with a small vocabulary."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=384,
        moe_intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        tie_word_embeddings=True,
    )
    return Qwen3MoeForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--ep", type=int, default=2, help="expert_parallel.autoep_size; 0: no AutoEP at all"
    )
    parser.add_argument("--zero", type=int, default=2, help="ZeRO stage")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient_clipping")
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = tiny_moe()

    def optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        # A callable: DeepSpeed calls it after AutoEP has replaced the MoE blocks, and ZeRO 1-2
        # want the expert parameters in their own 'moe' param groups.
        return torch.optim.AdamW(configure_moe_param_groups(list(params)), lr=1e-3)

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": args.clip,
        "zero_optimization": {"stage": args.zero},
        "steps_per_print": 10**9,
    }
    if args.ep:
        config["expert_parallel"] = {
            "enabled": True,
            "autoep_size": args.ep,
            "preset_model": "qwen3_moe",
        }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    if rank == 0:
        print("PROBE initialize ok:", type(engine.module.model.layers[0].mlp).__name__, flush=True)

    torch.manual_seed(1 + rank)  # each rank its own batch, as data parallelism would give it
    ids = torch.randint(0, 64, (2, 16))
    for step in range(args.steps):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        # The mean over ranks: the same number at any EP for the same global batch.
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            norm = engine.get_global_grad_norm()
            print(
                f"PROBE step {step} loss={mean.item() / dist.get_world_size():.8f} "
                f"grad_norm={float(norm) if norm is not None else float('nan'):.8f}",
                flush=True,
            )
    if rank == 0:
        print("PROBE OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
