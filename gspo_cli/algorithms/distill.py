"""On-policy distillation (shared/docs/multi-turn-and-teachers.md section 3): the teacher scores
the student's own samples, and each model token's advantage is its reverse-KL term.

    a_it = sg[log pi_T(y_it) - log pi_old(y_it)]        A_it = task_coef * A_i + coef * a_it

Environment (tool) tokens are never targets: `mask` is 0 on them, and on prompt and padding.
Losses whose ratio is per sequence (GSPO, LUSPO, GMPO) take the mean of A_it over the
sequence's tokens (`losses.sequence_advantage`), so every algorithm runs unchanged.
"""

from __future__ import annotations

import torch


def distill_advantages(
    task_advantages: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float,
    task_coef: float,
) -> torch.Tensor:
    """`[N, T]` A_it = task_coef * A_i + coef * a_it on model tokens, 0 elsewhere.

    Args:
        task_advantages: `[N]` the group advantages of the rewards, A_i.
        old_logprobs: `[N, T]` log pi_old(y_it) of the sampled tokens.
        teacher_logprobs: `[N, T]` log pi_T(y_it) of the same tokens.
        mask: `[N, T]` 1 on model tokens (tool results, prompt and padding 0).
    """
    mask = mask.to(torch.float64)
    reverse = (teacher_logprobs.detach().double() - old_logprobs.detach().double()) * mask
    task = task_advantages.detach().double().unsqueeze(1) * mask  # [N, T]
    return task_coef * task + coef * reverse  # [N, T] float64, as the group advantages


def reverse_kl_sums(
    old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """The sum over model tokens of log pi_old - log pi_T (the per-token reverse-KL estimate of
    KL(pi_old || pi_T) on the student's own samples) and the number of those tokens; sums, so
    that ranks add them up before dividing."""
    mask = mask.to(torch.float64)
    gap = (old_logprobs.detach().double() - teacher_logprobs.detach().double()) * mask  # [N, T]
    return float(gap.sum()), float(mask.sum())
