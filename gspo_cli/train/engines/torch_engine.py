"""Training engines behind one Protocol; this file ships the plain-torch, one-process engine.

Every engine is built the same way, `Engine(model, settings, ctx)` from plain settings
(engine_settings.py), and listed under the name `trainer.engine` takes in core/engine_catalogue.py;
`train/engines.make_engine` is the only place that chooses one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import ModelCapabilities, capabilities_of
from gspo_cli.models.forward.logprobs import EntropyMode, response_logprobs
from gspo_cli.models.loading import restore_weights
from gspo_cli.models.lora import Adapters
from gspo_cli.train.engines.adapters import add_adapters
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.optimiser import OPTIMIZER_FILE, adamw_with_schedule, set_schedule_peak
from gspo_cli.train.engines.settings import EngineSettings


class TrainEngine(Protocol):
    """What the RL loop needs from a training backend (plain torch, DeepSpeed)."""

    model: PreTrainedModel  # with LoRA: the HF model with peft's layers in it
    capabilities: ModelCapabilities  # decided once, when the engine wrapped the model
    adapters: Adapters | None  # model.lora: only they train; None: every weight does

    @property
    def allows_resharding(self) -> bool:
        """Whether a checkpoint resumes at another world size (whole, unpartitioned state)."""
        ...

    @property
    def partitions_weights(self) -> bool:
        """Whether each rank holds only a part of the weights (ZeRO-3): a forward needs every
        rank, so rollouts on the trainer's model run in step on all of them."""
        ...

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: EntropyMode = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[n, T]` response log-probs (with grad) and, when asked, entropy (with grad where
        `entropy` is "grad", see logprobs.EntropyMode)."""
        ...

    def backward(self, loss: torch.Tensor | None, boundary: bool) -> None:
        """Accumulate the gradient of `loss`; None: this micro-batch is left out (non-finite).
        `boundary`: the minibatch's last micro-batch (their number varies from step to step)."""
        ...

    def step(self, skip: bool = False) -> tuple[float, bool]:
        """Clip gradients and take one optimiser and scheduler step: (grad norm, applied).

        Nothing is applied when `skip` is set or the norm is not finite: the parameters and
        the optimizer state stay as they were (the non-finite guard)."""
        ...

    def weights_finite(self) -> bool:
        """Whether every parameter is finite (collective for multi-process engines)."""
        ...

    def set_peak_lr(self, lr: float) -> None:
        """Make `lr` the schedule's peak from the current step on, this one included: after
        `load_state` (which brings back the checkpoint's own peak) on resume and rollback."""
        ...

    @property
    def lr(self) -> float: ...

    def save_state(self, folder: Path) -> None:
        """Optimiser and scheduler state (collective for multi-process engines)."""
        ...

    def load_state(self, folder: Path) -> None:
        """Weights, optimiser and scheduler state from a checkpoint folder."""
        ...

    def save_model(self, path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        """The HF folder of the weights, or with LoRA of the adapters, and the tokenizer."""
        ...

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The current parameters by HF name, whole on every rank (a rollout engine syncs
        from them; collective under ZeRO-3); with LoRA, the adapters merged in."""
        ...


class UpdateFailed(GspoError):
    """An update was applied and cannot be taken back (DeepSpeed: a non-finite gradient norm).
    The loop hands it to the guards, which roll back or stop with the command to resume."""


class LogprobModel(Protocol):
    """Anything that scores responses: a training engine or a frozen reference policy."""

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: EntropyMode = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class FrozenPolicy:
    """Forward-only scorer of a frozen model (the KL reference)."""

    def __init__(self, model: PreTrainedModel, share_prompts: bool = False) -> None:
        self.model = model
        self.capabilities = capabilities_of(model, share_prompts=share_prompts)

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: EntropyMode = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = next(self.model.parameters()).device
        return response_logprobs(
            self.model, batch.to(device), temperature, entropy, self.capabilities
        )


class TorchEngine:
    """AdamW + LambdaLR on one device; gradient accumulation is the caller's backward calls."""

    allows_resharding = True  # one process holds the whole optimizer state
    partitions_weights = False

    def __init__(self, model: PreTrainedModel, settings: EngineSettings, ctx: DistContext) -> None:
        self.adapters = add_adapters(model, settings.lora)
        self.model = model if self.adapters is None else self.adapters.model
        self.capabilities = capabilities_of(self.model, share_prompts=settings.share_prompts)
        self.max_grad_norm = settings.optimizer.max_grad_norm
        params = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters
        self.optimizer, self.scheduler = adamw_with_schedule(
            params, settings.optimizer, settings.optimizer_steps
        )

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: EntropyMode = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = next(self.model.parameters()).device
        return response_logprobs(
            self.model, batch.to(device), temperature, entropy, self.capabilities
        )

    def backward(self, loss: torch.Tensor | None, boundary: bool) -> None:
        if loss is not None:
            loss.backward()

    def step(self, skip: bool = False) -> tuple[float, bool]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:  # AdamW steps every parameter the same way, whatever rows were run
            if p.grad is None:  # (an expert no row reached, a minibatch with no signal)
                p.grad = torch.zeros_like(p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        applied = not skip and math.isfinite(grad_norm)
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    def weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def set_peak_lr(self, lr: float) -> None:
        set_schedule_peak(self.scheduler, lr)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save_state(self, folder: Path) -> None:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, folder / OPTIMIZER_FILE)

    def load_state(self, folder: Path) -> None:
        try:
            state = torch.load(folder / OPTIMIZER_FILE, weights_only=False)
        except Exception as exc:  # zip/pickle errors of many kinds mean a damaged file
            raise GspoError(f"checkpoint {folder / OPTIMIZER_FILE} is corrupted: {exc}") from None
        if self.adapters is not None:
            self.adapters.load(folder)
        else:
            restore_weights(self.model, folder)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def save_model(self, path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        if self.adapters is not None:
            self.adapters.save(path)
        else:
            self.model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.adapters is not None:
            yield from self.adapters.merged_weights()
        else:
            yield from self.model.state_dict().items()
