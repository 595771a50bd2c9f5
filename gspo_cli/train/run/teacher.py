"""The distillation teacher of a run (`algorithm.distill`): its tokenizer checked against the
student's before anything is written, then loaded once, frozen, on every rank.

The teacher never changes, so a checkpoint stores nothing for it: a resume rebuilds it from
`algorithm.distill.teacher`, which a resume may not change (train/run/resume.py). Nor may its
files: a local teacher's are digested when the run starts (TEACHER_FILES in the run folder), and
a resume with other weights is refused, naming the file, as a LoRA base's is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.models.loading import convert_first, model_file_digests
from gspo_cli.models.vocab import load_tokenizer, vocab_problem
from gspo_cli.recipe.made_by import made_by
from gspo_cli.recipe.schema import Recipe
from gspo_cli.runs.folder import TEACHER_FILES, write_text_atomic
from gspo_cli.train.engines.torch_engine import FrozenPolicy
from gspo_cli.train.step.distill import Teacher

WHAT = "algorithm.distill.teacher"


def missing_teacher(recipe: Recipe, recipe_file: Path) -> str | None:
    """The one line refusing a teacher folder that is not there, with the command that makes
    it when the recipe's comments have one (recipe/made_by.py); None when it is there (or is
    no local path)."""
    distill = recipe.algorithm.distill
    if distill is None or not distill.teacher.startswith(("/", ".", "~")):
        return None
    folder = Path(distill.teacher).expanduser()
    if folder.exists():
        return None
    command = made_by(recipe_file, folder)
    how = f"; make it first: {command}" if command else ""
    return f"{WHAT}: no such folder: {distill.teacher}{how}"


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


def record_teacher(recipe: Recipe, run_dir: Path) -> None:
    """At a run's start: the teacher's path and the SHA-256 of each of its files (a GGUF, or a
    local folder's weights and config); nothing for a hub id or a built-in."""
    distill = recipe.algorithm.distill
    digests = None if distill is None else model_file_digests(distill.teacher)
    if distill is not None and digests is not None:
        record = {"teacher": distill.teacher, "sha256": digests}
        write_text_atomic(run_dir / TEACHER_FILES, json.dumps(record, indent=1) + "\n")


def check_resumed_teacher(recipe: Recipe, run_dir: Path) -> None:
    """On --resume: the teacher's files are those the run started with; one GspoError line
    naming the first that changed, appeared or went. A teacher path that changed is
    check_resumable's to refuse."""
    distill, file = recipe.algorithm.distill, run_dir / TEACHER_FILES
    if distill is None or not file.is_file():
        return
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
        started, recorded = record["teacher"], dict(record["sha256"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise GspoError(f"cannot read {file}: {exc}") from None
    if started != distill.teacher:
        return
    now = model_file_digests(distill.teacher) or {}
    for name in sorted(recorded.keys() | now.keys()):
        was, is_now = recorded.get(name), now.get(name)
        if was != is_now:
            what = (
                f"SHA-256 was {was[:12]}, it is {is_now[:12]} now"
                if was and is_now
                else ("it is gone" if was else "it was not there")
            )
            raise GspoError(
                f"--resume: the teacher's {name} in {distill.teacher} has changed since the run "
                f"started ({what}; {file}): put the original back, or start a new run"
            )
