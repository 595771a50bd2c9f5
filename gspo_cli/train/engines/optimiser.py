"""The recipe's AdamW and its learning-rate schedule, shared by every training engine."""

from __future__ import annotations

import torch

from gspo_cli.recipe.trainer import OptimizerConfig
from gspo_cli.train.engines.schedule import lr_lambda

OPTIMIZER_FILE = "optimizer.pt"


def adamw_with_schedule(
    params: list[torch.nn.Parameter], cfg: OptimizerConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """The recipe's AdamW and its warm-up/decay schedule (shared by every engine)."""
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.schedule, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )
    return optimizer, scheduler


def set_schedule_peak(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """Give `scheduler` the peak `lr` at the step it has reached. A restored LambdaLR keeps the
    checkpoint's base lrs (and the optimizer its current lr), which would override a recipe
    whose optimizer.lr changed on resume; the decay function itself is never saved (a closure),
    so it is already the recipe's."""
    scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
    step = scheduler.last_epoch
    for group, fn in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * fn(step)
