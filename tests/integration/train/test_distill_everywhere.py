"""On-policy distillation with the rest of gspo: LoRA (the teacher is its own model, never the
adapters' base), and asynchronous rollouts (pi_old is the behaviour policy's) on DeepSpeed with
two processes at ZeRO-3 (each rank scores its own rows with the whole teacher) reproduce the
one-process run. (ZeRO-2 alone is not run: ZeRO-3 with async rollouts holds every part of it,
and CI's time is better spent elsewhere.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import gspo_train, run_metrics

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

STEPS = 3
TEACHER = {"teacher": "builtin:tiny-dense", "seed": 7, "task_reward_coef": 0.5}
COMPARED = ("distill_reverse_kl", "loss", "grad_norm", "reward_mean", "token_ratio_mean")


def _recipe(tiny_recipe: Any, **over: Any) -> Path:  # type: ignore[no-untyped-def]
    base: dict[str, Any] = {
        "algorithm": {"name": "gspo_token", "minibatches": 2, "distill": TEACHER},
        "optimizer": {"lr": 1e-4},
        "rollout": {"seed_per_prompt": True},
        "trainer": {"steps": STEPS, "checkpoint_every": STEPS},
    }
    for key, value in over.items():
        base[key] = {**base.get(key, {}), **value}
    return tiny_recipe(**base)  # type: ignore[no-any-return]


def _train(recipe: Path, out: Path, *extra: str) -> dict[int, dict[str, Any]]:
    result = gspo_train(recipe, "--out", str(out), *extra)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_metrics(out)


def _same(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> None:
    assert all(a[s]["distill_reverse_kl"] > 0.05 for s in a), "the teacher adds nothing: vacuous"
    assert any(a[s]["grad_norm"] > 0 for s in a)
    for step in range(1, STEPS + 1):
        for key in COMPARED:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)


DEEPSPEED_TWO = ("--set", "trainer.engine=deepspeed", "--nproc", "2")


def test_async_rollouts_on_two_processes_zero3_reproduce_one_process(  # type: ignore[no-untyped-def]
    tiny_recipe, tmp_path: Path
) -> None:
    recipe = _recipe(tiny_recipe, rollout={"max_staleness": 1})
    one = _train(recipe, tmp_path / "one")
    assert [one[s]["rollout_staleness"] for s in one] == [0, 1, 1]
    two = _train(recipe, tmp_path / "two", *DEEPSPEED_TWO, "--set", "deepspeed.zero_stage=3")
    _same(one, two)


def test_lora_scores_against_the_teacher_not_the_adapters_base(  # type: ignore[no-untyped-def]
    tiny_recipe, sft_checkpoint: Path, tmp_path: Path
) -> None:
    """With the student's own base as the teacher, the first step's reverse KL is 0 (the
    adapters start as the identity); the adapters then move the student away from it, so the
    KL grows. A random teacher is far from step 1 on, and the adapters train."""
    lora = {"lora": {"r": 4, "alpha": 8}}
    own_base = {**TEACHER, "teacher": str(sft_checkpoint), "seed": None}
    a = _train(
        _recipe(tiny_recipe, model=lora, algorithm={"distill": own_base}, optimizer={"lr": 1e-2}),
        tmp_path / "own-base",
    )
    assert a[1]["distill_reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    assert a[STEPS]["distill_reverse_kl"] > 1e-4
    b = _train(_recipe(tiny_recipe, model=lora), tmp_path / "random")
    assert all(b[s]["distill_reverse_kl"] > 0.05 for s in b) and b[1]["grad_norm"] > 0
    adapters = tmp_path / "random" / "checkpoints" / f"step_{STEPS:06d}"
    assert any(adapters.rglob("adapter_model.safetensors")), sorted(adapters.rglob("*"))
