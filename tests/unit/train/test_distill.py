"""On-policy distillation (shared/docs/multi-turn-and-teachers.md section 3): the per-token
advantage equals its float64 loop definition, every loss and its gradient on it equal the loop
reference, tool tokens are never targets, a teacher equal to the student leaves the task's
update alone, and a teacher with other token ids is refused in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

from gspo_cli.algorithms import LossOptions, compute_policy_loss, resolve_loss_agg
from gspo_cli.algorithms.distill import distill_advantages, reverse_kl_sums
from gspo_cli.models import build_char_tokenizer, create_builtin
from gspo_cli.models.vocab import vocab_problem
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import FrozenPolicy
from gspo_cli.train.step.distill import Teacher
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.update import StepModels, train_groups
from tests.support.helpers import invoke_cli
from tests.support.loss_reference import TAUS, reference_loss
from tests.support.rl_helpers import GradCapturingEngine, tiny_step

Tensor = torch.Tensor
ALGOS = ["gspo", "gspo_token", "grpo", "luspo", "sapo", "gmpo", "cispo"]
CLIPS = {
    "gspo": (0.03, 0.04), "gspo_token": (0.03, 0.04), "grpo": (0.2, 0.27), "luspo": (0.01, 0.012),
    "sapo": (0.2, 0.2), "gmpo": (0.3, 0.3), "cispo": (0.2, 0.28),
}  # fmt: skip


def batch(seed: int, b: int = 4, t: int = 20) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """float64 log-probs (policy, pi_old, teacher), task advantages [B] and a model-token mask
    with tool results (0) between model turns; garbage where the mask is 0."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.05
    teacher = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.5
    mask = torch.ones(b, t, dtype=torch.float64)
    for i in range(b):
        start = int(torch.randint(2, 6, (1,), generator=g))  # a tool result in the middle
        mask[i, start : start + 3] = 0
        mask[i, t - i :] = 0  # padding
    garbage = torch.full_like(lp, 40.0)
    lp, old = torch.where(mask > 0, lp, garbage), torch.where(mask > 0, old, -garbage)
    teacher = torch.where(mask > 0, teacher, garbage)
    return lp, old, teacher, torch.randn(b, generator=g, dtype=torch.float64), mask


def loop_advantages(
    task: Tensor, old: Tensor, teacher: Tensor, mask: Tensor, coef: float, task_coef: float
) -> Tensor:
    out = torch.zeros_like(old)
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if mask[i, t] > 0:
                out[i, t] = task_coef * task[i] + coef * (teacher[i, t] - old[i, t])
    return out


@pytest.mark.parametrize("coef,task_coef", [(1.0, 0.0), (0.5, 1.0), (2.0, 0.3)])
def test_advantage_and_reverse_kl_equal_the_loop_definition(coef: float, task_coef: float) -> None:
    _, old, teacher, task, mask = batch(0)
    got = distill_advantages(task, old, teacher, mask, coef=coef, task_coef=task_coef)
    torch.testing.assert_close(
        got, loop_advantages(task, old, teacher, mask, coef, task_coef), rtol=0, atol=1e-15
    )
    gap, tokens = reverse_kl_sums(old, teacher, mask)
    pairs = [(i, t) for i in range(4) for t in range(20) if mask[i, t] > 0]
    assert tokens == len(pairs)
    assert gap == pytest.approx(sum(float(old[i, t] - teacher[i, t]) for i, t in pairs), abs=1e-12)


@pytest.mark.parametrize("algo", ALGOS)
def test_loss_and_gradient_equal_the_loop_reference(algo: str) -> None:
    lp, old, teacher, task, mask = batch(1)
    adv = distill_advantages(task, old, teacher, mask, coef=1.0, task_coef=0.5)
    x = lp.detach().clone().requires_grad_(True)
    loss, _ = compute_policy_loss(
        x, old, adv, mask, algorithm=algo, clip_low=CLIPS[algo][0], clip_high=CLIPS[algo][1],
        options=LossOptions(*TAUS),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, x)
    y = lp.detach().clone().requires_grad_(True)
    loop = loop_advantages(task, old, teacher, mask, 1.0, 0.5)
    agg = resolve_loss_agg(algo, None)  # each paper's (CISPO: token_mean)
    ref = reference_loss(y, old, loop, mask, algo, *CLIPS[algo], agg)
    (grad_ref,) = torch.autograd.grad(ref, y)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)
    assert (grad[mask == 0] == 0).all()  # a tool token is never a target


@pytest.mark.parametrize("algo", ["gspo", "luspo", "gmpo"])
def test_sequence_level_losses_take_the_sequence_mean(algo: str) -> None:
    """The documented rule: A_i' = task_coef A_i + coef x mean over the model tokens of a_it."""
    lp, old, teacher, task, mask = batch(2)
    adv = distill_advantages(task, old, teacher, mask, coef=1.5, task_coef=0.5)
    mean_gap = ((teacher - old) * mask).sum(1) / mask.sum(1)  # [B]
    per_sequence = 0.5 * task + 1.5 * mean_gap  # [B]
    args = dict(algorithm=algo, clip_low=CLIPS[algo][0], clip_high=CLIPS[algo][1])
    a, _ = compute_policy_loss(lp, old, adv, mask, **args)  # type: ignore[arg-type]
    b, _ = compute_policy_loss(lp, old, per_sequence, mask, **args)  # type: ignore[arg-type]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_tool_tokens_are_never_targets() -> None:
    _, old, teacher, task, mask = batch(3)
    moved = torch.where(mask > 0, teacher, torch.full_like(teacher, -1e4))  # any teacher there
    for t in (teacher, moved):
        adv = distill_advantages(task, old, t, mask, coef=1.0, task_coef=1.0)
        assert (adv[mask == 0] == 0).all()
    a = distill_advantages(task, old, teacher, mask, coef=1.0, task_coef=1.0)
    b = distill_advantages(task, old, moved, mask, coef=1.0, task_coef=1.0)
    assert torch.equal(a, b)
    assert reverse_kl_sums(old, teacher, mask) == reverse_kl_sums(old, moved, mask)


def test_teacher_equal_to_student_gives_zero_advantage() -> None:
    _, old, _, task, mask = batch(4)
    adv = distill_advantages(task, old, old.clone(), mask, coef=1.0, task_coef=0.0)
    assert (adv == 0).all()


# --- the RL step -------------------------------------------------------------------------------

G = 4
PROMPTS = [[2, 10, 11, 3, 6, 2], [2, 20, 21, 22, 3, 6, 2]]
LENGTHS = [3, 7, 5, 2, 4, 6, 8, 3]
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def _scored() -> ScoredGroups:
    rollout = RolloutBatch(
        [PROMPTS[i // G] for i in range(len(LENGTHS))],
        [[30 + (i + t) % 40 for t in range(n)] for i, n in enumerate(LENGTHS)],
        None,
        [""] * len(LENGTHS),
        [False] * len(LENGTHS),
    )
    return ScoredGroups(rollout, list(REWARDS), list(REWARDS), [0.0] * len(LENGTHS), [True, True])


def _step(algo: str, distill: dict[str, object] | None, teacher_seed: int | None):  # type: ignore[no-untyped-def]
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    algorithm = {"name": algo, "minibatches": 2, "distill": distill}
    recipe = Recipe.model_validate({"algorithm": algorithm})
    settings = tiny_step(
        recipe, sampling=SamplingParams(max_new_tokens=8, num_samples=G), tokenizer=tokenizer
    )
    teacher = None
    if teacher_seed is not None:
        frozen = create_builtin("tiny-dense", seed=teacher_seed)[0] if teacher_seed else model
        frozen = copy.deepcopy(frozen).eval().requires_grad_(False)
        # scored as the run scores it: the same forward paths as the trainer's
        teacher = Teacher(FrozenPolicy(frozen, recipe.trainer.share_prompts), memory_mb=1.0)
    engine = GradCapturingEngine(model, engine_settings(recipe), LOCAL)
    out = train_groups(StepModels(engine, teacher=teacher), _scored(), settings, step_seed=0)
    return out, engine.grads


@pytest.mark.parametrize("algo", ["gspo", "grpo"])
def test_teacher_equal_to_student_leaves_the_tasks_update(algo: str) -> None:
    _, task_grads = _step(algo, None, None)
    same = {"teacher": "builtin:tiny-dense", "task_reward_coef": 1.0}
    mixed, mixed_grads = _step(algo, same, 0)  # 0: the student's own weights
    assert mixed.metrics["distill_reverse_kl"] == 0.0
    assert mixed.metrics["teacher_memory_mb"] == 1.0 and mixed.metrics["teacher_time_s"] > 0
    for a, b in zip(task_grads, mixed_grads, strict=True):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)


def test_another_teacher_moves_a_pure_distillation_step() -> None:
    out, grads = _step("gspo_token", {"teacher": "builtin:tiny-dense", "seed": 5}, 5)
    # a random teacher disagrees (on fixed responses, not the student's samples, the
    # estimate may take either sign)
    assert abs(out.metrics["distill_reverse_kl"]) > 1e-3
    assert any(float(g.abs().sum()) > 0 for step in grads for g in step.values())


# --- a teacher with other token ids ------------------------------------------------------------


def _swapped_teacher(folder: Path) -> Path:
    """A built-in model saved with a tokenizer whose ids of '0' and '1' are swapped."""
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    file = folder / "tokenizer.json"
    data = json.loads(file.read_text())
    vocab = data["model"]["vocab"]
    vocab["0"], vocab["1"] = vocab["1"], vocab["0"]
    file.write_text(json.dumps(data))
    return folder


def test_a_tokenizer_mismatch_names_the_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    teacher = AutoTokenizer.from_pretrained(_swapped_teacher(tmp_path / "t"))
    line = vocab_problem(build_char_tokenizer(), teacher, "algorithm.distill.teacher")
    student = build_char_tokenizer()
    zero, one = student.convert_tokens_to_ids("0"), student.convert_tokens_to_ids("1")
    assert line is not None and "\n" not in line
    assert f"{zero} ('0' vs '1')" in line and f"{one} ('1' vs '0')" in line
    assert vocab_problem(student, build_char_tokenizer(), "x") is None


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_mismatched_teacher_is_refused_before_anything_is_written(
    tmp_path: Path, command: str
) -> None:
    teacher = _swapped_teacher(tmp_path / "teacher")
    recipe = tmp_path / "r.yaml"
    out = tmp_path / "runs"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"path": "builtin:tiny-dense"},
                "algorithm": {"distill": {"teacher": str(teacher)}},
                "trainer": {"out_dir": str(out)},
            }
        )
    )
    result = invoke_cli(command, str(recipe))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenizer differs" in lines[0] and "Traceback" not in result.stderr
    assert not out.exists()


def test_the_shipped_recipe_validates_with_a_teacher(tmp_path: Path) -> None:
    from tests.support.helpers import REPO

    model, tokenizer = create_builtin("tiny-dense", seed=3)
    model.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    recipe = str(REPO / "recipes" / "distill" / "arithmetic-opd.yaml")
    teacher = f"algorithm.distill.teacher={tmp_path / 'teacher'}"
    result = invoke_cli("validate", recipe, "--set", teacher)
    assert result.returncode == 0, result.stderr
    assert "distilling from" in result.stdout
