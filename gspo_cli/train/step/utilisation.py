"""How much of the hardware a step used: its counted FLOPs (models/flops.py) and MFU against the
measured matmul peak (train/engines/hardware.py), per phase.

`flops_rollout`: generating this rank's responses (prefill and decoding of every row).
`flops_train`: the training forwards and backwards of the trained rows (fillers and skipped
zero-advantage rows ran no useful work and are left out), plus the no-grad forwards that ran:
pi_old recomputed, the reference policy. `peak_flops`: this rank's peak. `mfu_rollout`,
`mfu_train`: FLOPs / (the phase's seconds x peak); over ranks, FLOPs and peaks add up and the
slowest rank's time counts (metric_rules.py).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from gspo_cli.models.flops import flop_shape, rollout_flops, train_flops
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.hardware import rank_peak
from gspo_cli.train.engines.metric_rules import mfu_metrics
from gspo_cli.train.engines.torch_engine import TrainEngine
from gspo_cli.train.step.micro import MicroBatch, StepPlan


def _rows(micro_batches: list[MicroBatch]) -> list[int]:
    return [int(r) for m in micro_batches if not m.filler for r in m.rows]


def flop_metrics(
    engine: TrainEngine,
    rollout: RolloutBatch,
    plan: StepPlan,
    no_grad_passes: list[list[MicroBatch]],
    times: dict[str, float],
    ctx: DistContext,
) -> dict[str, float]:
    """This rank's FLOPs and peak, and the MFU of each phase with a time in `times`
    (time_rollout_s, time_train_s). `no_grad_passes`: the micro-batches of each no-grad forward
    pass the step ran. With LoRA the base weights take no gradient (train_flops)."""
    model, frozen_base = engine.model, engine.adapters is not None
    shape = flop_shape(model.config)
    lengths = [
        (len(p), len(c)) for p, c in zip(rollout.prompt_ids, rollout.completion_ids, strict=True)
    ]
    trained = [r for micro in plan.minibatches for r in _rows(micro)]
    out = {
        "flops_rollout": float(rollout_flops(shape, rollout.prompt_ids, rollout.completion_ids)),
        "flops_train": float(
            train_flops(shape, lengths, trained, [_rows(p) for p in no_grad_passes], frozen_base)
        ),
        "peak_flops": rank_peak(_device_of(model), ctx),
    }
    out.update(mfu_metrics({**times, **out}))
    return out


def _device_of(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device
