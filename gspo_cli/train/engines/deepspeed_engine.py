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
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import ModelCapabilities, capabilities_of
from gspo_cli.models.forward.logprobs import EntropyMode, response_logprobs
from gspo_cli.models.routing import ExpertRouting, num_experts
from gspo_cli.train.engines.adapters import add_adapters
from gspo_cli.train.engines.autoep import autoep_layers, autoep_optimizer, hf_weights
from gspo_cli.train.engines.distributed import DistContext, check_expert_count
from gspo_cli.train.engines.optimiser import adamw_with_schedule, set_schedule_peak
from gspo_cli.train.engines.settings import EngineSettings
from gspo_cli.train.engines.torch_engine import UpdateFailed

EP_FILE = "expert_parallel.json"  # beside DeepSpeed's shards: the expert-parallel size

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


def deepspeed_config(
    settings: EngineSettings, world: int, model_config: PretrainedConfig | None = None
) -> dict[str, Any]:
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
    if cfg.expert_parallel > 1:
        derived["expert_parallel"] = autoep_config(cfg.expert_parallel, model_config)
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
    if "expert_parallel" in user:
        raise GspoError(
            "deepspeed.config_file: 'expert_parallel' is set by the recipe's "
            "deepspeed.expert_parallel"
        )
    merged = {**user, **derived}
    merged["zero_optimization"] = {**user.get("zero_optimization", {}), **zero}
    return merged


def autoep_config(ep: int, model_config: PretrainedConfig | None) -> dict[str, Any]:
    """DeepSpeed's `expert_parallel` section: AutoEP over `ep` ranks, its model preset found
    from the model type, the top-k renormalisation the model's own router does."""
    section: dict[str, Any] = {"enabled": True, "autoep_size": ep}
    norm = getattr(model_config, "norm_topk_prob", None)
    if isinstance(norm, bool):
        section["route_norm"] = norm
    return section


class DeepSpeedEngine:
    """A `TrainEngine` on `deepspeed.initialize`, with the recipe's AdamW and schedule."""

    def __init__(self, model: PreTrainedModel, settings: EngineSettings, ctx: DistContext) -> None:
        import deepspeed

        self.adapters = add_adapters(model, settings.lora)  # LoRA: only they train
        model = model if self.adapters is None else self.adapters.model
        self.ctx = ctx
        self.zero_stage = settings.deepspeed.zero_stage
        self._zero0_norm = float("nan")  # ZeRO-0: the last boundary's gradient norm
        self.expert_parallel = settings.deepspeed.expert_parallel
        check_expert_count(num_experts(model.config), self.expert_parallel)
        config = deepspeed_config(settings, ctx.world, model.config)
        optimizer: Any  # the AdamW and its schedule, or with AutoEP callables that build them
        scheduler: Any
        if self.expert_parallel > 1:
            optimizer, scheduler = autoep_optimizer(settings)
        else:
            optimizer, scheduler = adamw_with_schedule(
                [p for p in model.parameters() if p.requires_grad],
                settings.optimizer,
                settings.optimizer_steps,
            )
        self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
        )
        self.model: PreTrainedModel = self.ds.module
        self.autoep = autoep_layers(self.model)
        if self.autoep:
            ExpertRouting.forget(self.model)  # its MoE blocks are AutoEP layers now
        if self.expert_parallel > 1 and not self.autoep:
            raise GspoError(
                f"deepspeed.expert_parallel: DeepSpeed AutoEP found no MoE layer it can shard in "
                f"{type(self.model).__name__}"
            )
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
        """ZeRO-3 spreads every weight over the ranks, expert parallelism the experts: every
        forward is then a collective that all ranks run together."""
        return self.zero_stage == 3 or bool(self.autoep)

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
        """Collective: every rank writes its ZeRO shards (and with expert parallelism its
        experts' states); the expert-parallel size is written beside them."""
        self.ds.save_checkpoint(str(folder / "deepspeed"), tag="state")
        if self.ctx.is_main:
            (folder / "deepspeed" / EP_FILE).write_text(
                json.dumps({"expert_parallel": self.expert_parallel}), encoding="utf-8"
            )

    def load_state(self, folder: Path) -> None:
        ep_file = folder / "deepspeed" / EP_FILE
        saved = json.loads(ep_file.read_text("utf-8"))["expert_parallel"] if ep_file.exists() else 1
        if saved != self.expert_parallel:
            raise GspoError(
                f"checkpoint {folder}: saved at deepspeed.expert_parallel {saved}, resumed at "
                f"{self.expert_parallel}: resume at the same expert parallelism"
            )
        if self.adapters is not None:  # DeepSpeed loads the adapters itself: check their base
            self.adapters.check_base(folder)
        path, _ = self.ds.load_checkpoint(
            str(folder / "deepspeed"), tag="state", load_module_strict=False
        )
        if path is None:
            raise GspoError(f"checkpoint {folder}: no DeepSpeed state to resume from")

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective under ZeRO-3: each parameter is gathered in turn, copied, released (with
        LoRA all at once, to merge the adapters in). With expert parallelism, collective: the
        experts are gathered and the HF layout rebuilt."""
        if self.autoep:
            yield from hf_weights(self.model, zero3=self.zero_stage == 3)
            return
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
        """Collective under ZeRO-3 and expert parallelism (weights are gathered); rank 0 writes
        the HF folder (whole experts in the HF layout)."""
        if self.autoep:
            state = {name: t.to("cpu") for name, t in self.full_weights()}
        elif self.zero_stage == 3:
            state = self.ds._zero3_consolidated_16bit_state_dict()
        else:
            state = None
        if not self.ctx.is_main:
            return
        if self.adapters is not None:
            self.adapters.save(path, state)
        else:
            self.model.save_pretrained(path, state_dict=state)
        tokenizer.save_pretrained(path)
