"""The distillation teacher of a run (`algorithm.distill`): its tokenizer checked against the
student's before anything is written, then loaded once, frozen, on every rank.

The teacher never changes, so a checkpoint stores nothing for it: a resume rebuilds it from
`algorithm.distill.teacher`, which a resume may not change (train/run/resume.py).
"""

from __future__ import annotations

import torch
from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.models.loading import convert_first
from gspo_cli.models.vocab import load_tokenizer, vocab_problem
from gspo_cli.recipe.schema import Recipe
from gspo_cli.train.engines.torch_engine import FrozenPolicy
from gspo_cli.train.step.distill import Teacher

WHAT = "algorithm.distill.teacher"


def teacher_problem(recipe: Recipe, *, hub: bool) -> str | None:
    """The one line refusing a teacher whose tokenizer maps some id to another token than the
    student's (model.path's: a cold start keeps it), or None. With `hub` False (validation) a
    hub id is not downloaded and not checked; `gspo train` checks with `hub` True."""
    distill = recipe.algorithm.distill
    if distill is None:
        return None
    convert_first(distill.teacher, what=WHAT)  # a GGUF converted or refused first
    student = load_tokenizer(recipe.model.path, what="model.path", hub=hub)
    teacher = load_tokenizer(distill.teacher, what=WHAT, hub=hub)
    if student is None or teacher is None:
        return None
    return vocab_problem(student, teacher, WHAT)


def check_teacher(recipe: Recipe) -> None:
    """`teacher_problem` (the hub included) as one GspoError line."""
    problem = teacher_problem(recipe, hub=True)
    if problem is not None:
        raise GspoError(problem)


def load_teacher(recipe: Recipe, device: torch.device, console: Console) -> Teacher | None:
    """The frozen teacher on `device` (None without distillation), said in one line."""
    distill = recipe.algorithm.distill
    if distill is None:
        return None
    seed = recipe.trainer.seed if distill.seed is None else distill.seed
    model, _ = load_policy(
        distill.teacher,
        dtype=recipe.model.dtype,
        seed=seed,
        trust_remote_code=recipe.model.trust_remote_code,
        what=WHAT,
    )
    model = model.to(device).eval().requires_grad_(False)
    tensors = [*model.parameters(), *model.buffers()]
    memory_mb = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    count = sum(p.numel() for p in model.parameters())
    console.print(
        f"teacher: {distill.teacher} ({count / 1e6:.2f} M parameters, {memory_mb:.1f} MB), "
        f"coef {distill.coef:g}, task_reward_coef {distill.task_reward_coef:g}",
        highlight=False,
        soft_wrap=True,
    )
    return Teacher(FrozenPolicy(model, recipe.trainer.share_prompts), memory_mb)
