"""Training engines behind one Protocol; this file ships the plain-torch, one-process engine."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.errors import GspoError
from gspo_cli.models.loading import restore_weights
from gspo_cli.recipe.schema import OptimizerConfig
from gspo_cli.train.batch import TrainBatch
from gspo_cli.train.logprobs import response_logprobs
from gspo_cli.train.schedule import lr_lambda


class TrainEngine(Protocol):
    """What the RL loop needs from a training backend (plain torch, DeepSpeed)."""

    model: PreTrainedModel

    def logprobs(self, batch: TrainBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`[n, T]` response log-probs (with grad) and entropy (no grad)."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Clip gradients, take one optimiser and scheduler step; return the grad norm."""
        ...

    @property
    def lr(self) -> float: ...

    def save_state(self, folder: Path) -> None:
        """Optimiser and scheduler state (collective for multi-process engines)."""
        ...

    def load_state(self, folder: Path) -> None:
        """Weights, optimiser and scheduler state from a checkpoint folder."""
        ...

    def save_model(self, path: Path, tokenizer: PreTrainedTokenizerBase) -> None: ...


OPTIMIZER_FILE = "optimizer.pt"


class LogprobModel(Protocol):
    """Anything that scores responses: a training engine or a frozen reference policy."""

    def logprobs(
        self, batch: TrainBatch, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class FrozenPolicy:
    """Forward-only scorer of a frozen model (the KL reference)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model

    def logprobs(self, batch: TrainBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        return response_logprobs(
            self.model, batch.to(next(self.model.parameters()).device), temperature
        )


class TorchEngine:
    """AdamW + LambdaLR on one device; gradient accumulation is the caller's backward calls."""

    def __init__(self, model: PreTrainedModel, cfg: OptimizerConfig, total_steps: int) -> None:
        self.model = model
        self.max_grad_norm = cfg.max_grad_norm
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(cfg.schedule, cfg.warmup_steps, total_steps, cfg.min_lr_ratio),
        )

    def logprobs(self, batch: TrainBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        return response_logprobs(
            self.model, batch.to(next(self.model.parameters()).device), temperature
        )

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

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
        restore_weights(self.model, folder)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def save_model(self, path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model.save_pretrained(path)
        tokenizer.save_pretrained(path)
