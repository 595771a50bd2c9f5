"""On-policy distillation in an RL step (docs/distillation.md): the teacher scores the step's
responses in one no-grad forward over the same micro-batches as pi_old, and the per-token
advantages become task_reward_coef x A_i + coef x (log pi_T - log pi_old) on model tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gspo_cli.algorithms.distill import distill_advantages, reverse_kl_sums
from gspo_cli.train.engines.torch_engine import LogprobModel
from gspo_cli.train.step.old_policy import PiOldInputs, forward_no_grad
from gspo_cli.train.step.settings import DistillSettings


@dataclass(frozen=True)
class Teacher:
    """A frozen teacher, as a step uses it (built by train/run/teacher.py)."""

    policy: LogprobModel
    memory_mb: float  # its parameters' and buffers' bytes, in MiB


def teacher_advantages(
    teacher: Teacher,
    config: DistillSettings,
    forward: PiOldInputs,
    task_advantages: torch.Tensor,
    old_logprobs: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`[N, T]` the distillation advantages of this rank's rows, and the step's metrics.

    The teacher runs pi_old's no-grad forward (`forward`: the batch, its micro-batches, the
    temperature, the ranks). It is scored at the sampling temperature, as pi_old is: both
    sides of a_t are the same transformation of their logits, so a teacher equal to the
    student gives a_t = 0. The micro-batches cover every row (pi_old of every row is read), so
    each rank scores its own rows; the reverse KL is summed over ranks before the division.
    """
    batch, ctx = forward.batch, forward.ctx
    started = time.perf_counter()
    teacher_lp = forward_no_grad(teacher.policy, batch, forward.plan, forward.temperature)  # [N, T]
    elapsed = time.perf_counter() - started
    mask = batch.response_mask  # [N, T] model tokens: tool results, prompt and padding are 0
    advantages = distill_advantages(
        task_advantages, old_logprobs, teacher_lp, mask,
        coef=config.coef, task_coef=config.task_reward_coef,
    )  # fmt: skip
    gap, tokens = reverse_kl_sums(old_logprobs, teacher_lp, mask)
    gap, tokens = ctx.all_reduce_sum(gap), ctx.all_reduce_sum(tokens)
    metrics = {
        "distill_reverse_kl": gap / max(tokens, 1.0),
        "teacher_time_s": elapsed,
        "teacher_memory_mb": teacher.memory_mb,
    }
    return advantages, metrics


def sequence_view(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[N]` each row's mean advantage over its model tokens: what the step's advantage
    metrics (and GSPO's sequence ratio) see of per-token advantages."""
    mask = mask.to(advantages.dtype)
    return (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def token_signal(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[N]` bool: rows with a nonzero advantage on some model token (the others add exactly
    0 to every loss's gradient and may be skipped)."""
    return ((advantages * mask.to(advantages.dtype)) != 0).any(dim=1)
