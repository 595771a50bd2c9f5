"""The DeepSpeed training engine: ZeRO 0-3, bf16 or fp32, offload, from the engine settings.

Gradient accumulation is driven by the RL step: it calls `backward` once per micro-batch and
`step` once per minibatch. The number of micro-batches varies (zero-advantage rows are left
out, rows are bucketed under a token budget), so each `backward` sets DeepSpeed's accumulation
boundary itself and DeepSpeed steps exactly on the minibatch's last one; losses arrive
already normalised (`scale_wrt_gas=False`). `gradient_accumulation_steps` is the count with
no row left out, for DeepSpeed's own bookkeeping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.errors import GspoError
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import ModelCapabilities, capabilities_of
from gspo_cli.models.forward.logprobs import EntropyMode, response_logprobs
from gspo_cli.train.engines.adapters import add_adapters
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.optimiser import adamw_with_schedule, set_schedule_peak
from gspo_cli.train.engines.settings import EngineSettings
from gspo_cli.train.engines.torch_engine import UpdateFailed

# Keys the recipe owns; a user's JSON may repeat them only with the same value.
RECIPE_OWNED = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16",
    "fp16",
    "optimizer",
    "scheduler",
)


def micro_batches_per_step(settings: EngineSettings, world: int) -> tuple[int, int]:
    """(micro-batch size, micro-batches per optimiser step) on one rank."""
    local_minibatch = settings.rows_per_minibatch // world
    micro = settings.micro_batch_size or local_minibatch
    return micro, local_minibatch // micro


def deepspeed_config(settings: EngineSettings, world: int) -> dict[str, Any]:
    """The DeepSpeed JSON for these settings, merged over the user's file if one is given."""
    cfg = settings.deepspeed
    micro, accumulation = micro_batches_per_step(settings, world)
    derived: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": settings.optimizer.max_grad_norm,
        "bf16": {"enabled": settings.bf16},
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,  # progress is ours
        "wall_clock_breakdown": False,
    }
    zero = derived["zero_optimization"]
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu"}
    if cfg.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if cfg.config_file is None:
        return derived
    try:
        user = json.loads(Path(cfg.config_file).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise GspoError(f"deepspeed.config_file: cannot read {cfg.config_file}: {exc}") from None
    for key in RECIPE_OWNED:
        if key in user and key in derived and user[key] != derived[key]:
            raise GspoError(
                f"deepspeed.config_file: {key}={user[key]!r} contradicts the recipe "
                f"({derived[key]!r}); remove it from the JSON"
            )
        if key in ("optimizer", "scheduler") and key in user:
            raise GspoError(
                f"deepspeed.config_file: '{key}' is set by the recipe's optimizer section"
            )
    merged = {**user, **derived}
    merged["zero_optimization"] = {**user.get("zero_optimization", {}), **zero}
    return merged


class DeepSpeedEngine:
    """A `TrainEngine` on `deepspeed.initialize`, with the recipe's AdamW and schedule."""

    def __init__(self, model: PreTrainedModel, settings: EngineSettings, ctx: DistContext) -> None:
        import deepspeed

        self.adapters = add_adapters(model, settings.lora)  # LoRA: only they train
        model = model if self.adapters is None else self.adapters.model
        optimizer, scheduler = adamw_with_schedule(
            [p for p in model.parameters() if p.requires_grad],
            settings.optimizer,
            settings.optimizer_steps,
        )
        self.ctx = ctx
        self.zero_stage = settings.deepspeed.zero_stage
        self._zero0_norm = float("nan")  # ZeRO-0: the last boundary's gradient norm
        self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=deepspeed_config(settings, ctx.world),
        )
        self.model: PreTrainedModel = self.ds.module
        # DeepSpeed's own forward, never the hand-written head (ZeRO-3 gathers the weights only
        # inside it) and so never shared prompts; decoding and routing are the model's.
        own = capabilities_of(self.model)
        self.capabilities = ModelCapabilities(
            plain_head=False,
            shares_prompts=False,
            attention_window=own.attention_window,
            drops_finished_rows=own.drops_finished_rows,
            records_routing=own.records_routing,
        )

    @property
    def allows_resharding(self) -> bool:
        """ZeRO-0 keeps whole optimizer states; ZeRO 1-3 partition them per rank."""
        return self.zero_stage == 0

    @property
    def partitions_weights(self) -> bool:
        return self.zero_stage == 3

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: EntropyMode = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self.ds.device
        return response_logprobs(self.ds, batch.to(device), temperature, entropy, self.capabilities)

    def backward(self, loss: torch.Tensor | None, boundary: bool) -> None:
        # DeepSpeed averages gradients over ranks; the loss is normalised by global counts, so
        # multiplying by the world size turns that average into the global sum. A non-finite
        # micro-batch (None) adds no gradient. The number of micro-batches varies (skipped
        # rows, token budget), so the RL step says where the boundary is.
        self.ds.set_gradient_accumulation_boundary(boundary)
        if loss is not None:
            self.ds.backward(loss * self.ctx.world, scale_wrt_gas=False)
        if boundary and self.zero_stage == 0:
            # ZeRO-0 clips without keeping the norm: read it from the gradients, which the
            # boundary's backward has all-reduced (the same on every rank)
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            self._zero0_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.ds.step()  # applies the optimiser only on the accumulation boundary

    def step(self, skip: bool = False) -> tuple[float, bool]:
        """DeepSpeed has already stepped at the boundary (inside `backward`): a skipped
        micro-batch was left out of it. A non-finite gradient that reached the optimizer
        cannot be taken back, so it stops the run (the plain engine skips it instead)."""
        if not self.ds.was_step_applied():
            raise RuntimeError("DeepSpeed did not step at the minibatch boundary")
        norm = self._zero0_norm if self.zero_stage == 0 else self.ds.get_global_grad_norm()
        grad_norm = float(norm)
        if not math.isfinite(grad_norm):
            raise UpdateFailed("DeepSpeed applied an update with a non-finite gradient norm")
        return grad_norm, True

    def weights_finite(self) -> bool:
        local = all(bool(torch.isfinite(p.data).all()) for p in self.model.parameters())
        return self.ctx.all_reduce_sum(0.0 if local else 1.0) == 0.0

    def set_peak_lr(self, lr: float) -> None:
        set_schedule_peak(self.scheduler, lr)

    @property
    def lr(self) -> float:
        return float(self.ds.get_lr()[0])

    def save_state(self, folder: Path) -> None:
        """Collective: every rank writes its ZeRO shards."""
        self.ds.save_checkpoint(str(folder / "deepspeed"), tag="state")

    def load_state(self, folder: Path) -> None:
        if self.adapters is not None:  # DeepSpeed loads the adapters itself: check their base
            self.adapters.check_base(folder)
        path, _ = self.ds.load_checkpoint(
            str(folder / "deepspeed"), tag="state", load_module_strict=False
        )
        if path is None:
            raise GspoError(f"checkpoint {folder}: no DeepSpeed state to resume from")

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective under ZeRO-3: each parameter is gathered in turn, copied, released (with
        LoRA all at once, to merge the adapters in)."""
        if self.zero_stage != 3:
            if self.adapters is not None:
                yield from self.adapters.merged_weights()
            else:
                yield from self.model.state_dict().items()
            return
        import deepspeed

        if self.adapters is not None:
            with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
                merged = [(n, t.detach().clone()) for n, t in self.adapters.merged_weights()]
            yield from merged
            return
        for name, param in self.model.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.data.detach().clone()

    def save_model(self, path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        """Collective under ZeRO-3 (weights are gathered); rank 0 writes the HF folder."""
        state = self.ds._zero3_consolidated_16bit_state_dict() if self.zero_stage == 3 else None
        if not self.ctx.is_main:
            return
        if self.adapters is not None:
            self.adapters.save(path, state)
        else:
            self.model.save_pretrained(path, state_dict=state)
        tokenizer.save_pretrained(path)
