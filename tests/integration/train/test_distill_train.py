"""`gspo train` with on-policy distillation from a built-in teacher: the run logs the reverse
KL and the teacher's cost, a resume reproduces the uninterrupted run, and a resume with another
teacher is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.helpers import invoke_cli, one_error_line

DISTILL = {
    "algorithm": {
        "name": "gspo_token",
        "distill": {"teacher": "builtin:tiny-dense", "seed": 7, "task_reward_coef": 0.0},
    },
    "optimizer": {"lr": 1e-4},
    "rollout": {"seed_per_prompt": True},
}


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


def test_distillation_logs_and_resumes_exactly(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    straight = tmp_path / "straight"
    recipe = tiny_recipe(**DISTILL, trainer={"steps": 3, "checkpoint_every": 2})
    result = invoke_cli("train", str(recipe), "--out", str(straight))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "teacher: builtin:tiny-dense" in result.stdout
    a = _metrics(straight)
    assert sorted(a) == [1, 2, 3]
    for step in a.values():
        # the student's own samples against a random teacher: the estimate is a KL, far from 0
        assert math.isfinite(step["distill_reverse_kl"]) and step["distill_reverse_kl"] > 0.1
        assert step["teacher_time_s"] > 0 and step["teacher_memory_mb"] > 0

    # stopped after step 2's checkpoint, resumed: step 3 is the uninterrupted run's
    resumed = tmp_path / "resumed"
    first = tiny_recipe(**DISTILL, trainer={"steps": 2, "checkpoint_every": 2})
    assert invoke_cli("train", str(first), "--out", str(resumed)).returncode == 0
    recipe = tiny_recipe(**DISTILL, trainer={"steps": 3, "checkpoint_every": 2})
    result = invoke_cli("train", str(recipe), "--out", str(resumed), "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    b = _metrics(resumed)
    for key in ("distill_reverse_kl", "loss", "grad_norm", "reward_mean"):
        assert b[3][key] == pytest.approx(a[3][key], rel=1e-5, abs=1e-9), key

    # the teacher is what the checkpoints were trained towards: another one is refused
    result = invoke_cli(
        "train", str(recipe), "--out", str(resumed), "--resume",
        "--set", "algorithm.distill.seed=8",
    )  # fmt: skip
    assert result.returncode == 2
    assert "algorithm.distill.seed" in result.stderr and "Traceback" not in result.stderr


def test_a_resume_with_the_teachers_weights_replaced_is_refused_naming_the_file(
    tiny_recipe,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """A local teacher's files are digested when the run starts: replacing its weights under a
    run and resuming would silently distil towards another model."""
    from gspo_cli.models import load_policy

    teacher = tmp_path / "teacher"
    for seed in (7, 8):  # the second save is the replacement, kept aside
        model, tokenizer = load_policy("builtin:tiny-dense", seed=seed)
        model.save_pretrained(teacher if seed == 7 else tmp_path / "other")
    tokenizer.save_pretrained(teacher)
    local = {**DISTILL, "algorithm": {"name": "gspo_token", "distill": {"teacher": str(teacher)}}}
    run = tmp_path / "run"
    first = tiny_recipe(**local, trainer={"steps": 1, "checkpoint_every": 1})
    assert invoke_cli("train", str(first), "--out", str(run)).returncode == 0
    assert json.loads((run / "teacher.json").read_text())["teacher"] == str(teacher)
    original = (teacher / "model.safetensors").read_bytes()
    (teacher / "model.safetensors").write_bytes(
        (tmp_path / "other" / "model.safetensors").read_bytes()
    )
    recipe = tiny_recipe(**local, trainer={"steps": 2, "checkpoint_every": 1})
    result = invoke_cli("train", str(recipe), "--out", str(run), "--resume")
    line = one_error_line(result, f"the teacher's model.safetensors in {teacher} has changed")
    assert "put the original back, or start a new run" in line
    assert sorted(_metrics(run)) == [1]  # nothing of step 2 was run
    (teacher / "model.safetensors").write_bytes(original)
    again = invoke_cli("train", str(recipe), "--out", str(run), "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(_metrics(run)) == [1, 2]
