"""A stop's advice names the cause the run's metrics show, and resumes with that setting."""

from __future__ import annotations

from pathlib import Path

import yaml

from gspo_cli.recipe import Recipe
from gspo_cli.runs.folder import CHECKPOINTS, LATEST, RECIPE
from gspo_cli.train.run.guard import Decision, Guard, Remedy, resume_advice
from gspo_cli.train.run.resume import check_resumable


def _step(**values: float) -> dict[str, float]:
    healthy = {
        "reward_mean": 0.6, "entropy": 0.3, "entropy_before": 0.3, "kl": 0.001,
        "grad_norm": 0.5, "seq_ratio_min": 0.99, "seq_ratio_max": 1.01,
    }  # fmt: skip
    return {**healthy, **values}


def _stop(guard: Guard, broken: list[dict[str, float]]) -> Decision:
    """Five healthy steps, then `broken` ones until the guard stops the run."""
    for step, metrics in enumerate([_step()] * 5 + broken, start=1):
        decision = guard.after_step(step, metrics, 1)
        if decision.action == "stop":
            return decision
    raise AssertionError("the guard never stopped the run")


def _remedy(guard: Guard, broken: list[dict[str, float]]) -> Remedy:
    remedy = _stop(guard, broken).remedy
    assert remedy is not None
    return remedy


def test_entropy_rising_under_an_entropy_bonus_names_the_bonus() -> None:
    exploded = [_step(entropy=2.0)]
    remedy = _remedy(Guard(3, "stop", 0, entropy_coef=0.05), exploded)
    assert (remedy.key, remedy.value) == ("algorithm.entropy_coef", 0.0)
    assert "entropy rose from 0.3 to 2 nats" in remedy.why
    assert "algorithm.entropy_coef 0.05" in remedy.why
    # the same explosion without a bonus: the steps are too large
    assert _remedy(Guard(3, "stop", 0), exploded).key == "optimizer.lr"


def test_a_growing_kl_under_a_kl_penalty_names_the_penalty() -> None:
    drifted = [_step(reward_mean=0.0, kl=0.4)] * 3  # a reward crash, KL 0.001 -> 0.4
    remedy = _remedy(Guard(3, "stop", 0, kl_coef=0.05), drifted)
    assert (remedy.key, remedy.value) == ("algorithm.kl_coef", 0.1)
    assert "KL to the reference grew from 0.001 to 0.4" in remedy.why
    small = [_step(reward_mean=0.0, kl=0.05)] * 3  # grew, but still small: not the KL
    assert _remedy(Guard(3, "stop", 0, kl_coef=0.05), small).key == "optimizer.lr"


def test_ratio_and_gradient_norm_blowups_name_the_learning_rate() -> None:
    wild = [_step(seq_ratio_min=0.1, seq_ratio_max=9.0)] * 2
    remedy = _remedy(Guard(3, "stop", 0, kl_coef=0.05), wild)
    assert remedy.key == "optimizer.lr" and remedy.value is None
    assert "sequence ratio blew up" in remedy.why and "lower the learning rate" in remedy.why
    crashed = [_step(reward_mean=0.0, grad_norm=40.0)] * 3
    remedy = _remedy(Guard(3, "stop", 0), crashed)
    assert "gradient norm rose from 0.5 to 40" in remedy.why


def test_non_finite_updates_name_the_learning_rate_even_with_a_bonus() -> None:
    broken = [_step(entropy=2.0, bad_updates=1.0, bad_updates_trailing=1.0)]
    remedy = _remedy(Guard(1, "stop", 0, entropy_coef=0.05), broken)
    assert remedy.key == "optimizer.lr" and "non-finite" in remedy.why


def test_the_resume_command_changes_the_setting_the_remedy_names() -> None:
    argv = ["train", "r.yaml", "--set", "algorithm.entropy_coef=0.05", "--out", "runs/x"]
    bonus = Remedy("algorithm.entropy_coef", "entropy rose", 0.0)
    assert resume_advice(Path("runs/x"), 5e-6, 1, argv, bonus) == (
        "gspo train r.yaml --out runs/x --set algorithm.entropy_coef=0 --resume"
    )
    rate = Remedy("optimizer.lr", "the steps are too large")
    assert resume_advice(Path("runs/x"), 5e-6, 1, ["train", "r.yaml"], rate) == (
        "gspo train r.yaml --set optimizer.lr=5e-06 --resume"
    )


def test_a_resume_accepts_the_settings_the_advice_changes(tmp_path: Path) -> None:
    def recipe(**algorithm: float) -> str:
        tree = Recipe.model_validate({"algorithm": algorithm}).model_dump(mode="json")
        return yaml.safe_dump(tree)

    (tmp_path / RECIPE).write_text(recipe(entropy_coef=0.05, kl_coef=0.05))
    (tmp_path / CHECKPOINTS).mkdir()
    (tmp_path / CHECKPOINTS / LATEST).write_text("step_000004")
    check_resumable(tmp_path, recipe(entropy_coef=0.0, kl_coef=0.1))  # no error
