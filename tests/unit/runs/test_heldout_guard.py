"""The held-out guard weighs a drop against the evaluation's own noise (problems x samples)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gspo_cli.compare.runs import Problems, load_run
from gspo_cli.compare.verdicts import detector_issues
from gspo_cli.runs.collapse import (
    HELDOUT_ALPHA,
    CollapseDetector,
    HeldoutSize,
    heldout_drop_p,
    replay,
)
from gspo_cli.train.run.guard import Guard


def _drop(size: HeldoutSize, best: float, current: float) -> str | None:
    detector = CollapseDetector(heldout_size=size)
    assert detector.observe_heldout(0, best) is None
    event = detector.observe_heldout(5, current)
    return None if event is None else event.signal


def test_one_problem_of_eight_is_noise_not_a_collapse() -> None:
    """The dynamic-sampling run stopped at step 3: 8 problems x 1 sample, 12.5% -> 0%."""
    assert heldout_drop_p(0.125, 0.0, 8) == pytest.approx(0.5)
    assert _drop(HeldoutSize(8, 1), 0.125, 0.0) is None
    assert _drop(HeldoutSize(8, 1), 0.5, 0.0) is None  # 4 of 8 -> 0: p = 0.038, still noise


def test_a_large_evaluation_that_falls_is_a_collapse() -> None:
    assert _drop(HeldoutSize(200, 4), 0.5, 0.2) == "heldout_drop"
    assert heldout_drop_p(0.5, 0.2, 200) < 1e-9


@pytest.mark.parametrize(
    ("current", "fires"),
    [(0.05, True), (0.10, False)],  # 8 of 20 -> 1 (p = 0.0098) and -> 2 (p = 0.032)
)
def test_the_borderline_on_each_side_of_the_level(current: float, fires: bool) -> None:
    p = heldout_drop_p(0.4, current, 20)
    assert (p < HELDOUT_ALPHA) is fires
    assert (_drop(HeldoutSize(20, 4), 0.4, current) == "heldout_drop") is fires


def test_samples_per_problem_do_not_shrink_the_noise() -> None:
    """Correlated within a problem: 20 problems x 64 samples is as noisy as 20 x 1."""
    assert _drop(HeldoutSize(20, 64), 0.4, 0.1) is None
    # avg@k counts that are not whole problems round toward each other: 1.25 problems -> 2
    assert heldout_drop_p(0.4, 0.0625, 20) == heldout_drop_p(0.4, 0.1, 20)


def test_a_significant_but_small_drop_stays_under_the_floor() -> None:
    """2000 problems: 10% -> 4% is far from noise and under half, but only 6 points."""
    assert heldout_drop_p(0.1, 0.04, 2000) < 1e-6
    assert _drop(HeldoutSize(2000, 1), 0.1, 0.04) is None
    assert _drop(HeldoutSize(2000, 1), 0.3, 0.24) is None  # 6 points, not under half


def test_the_guard_uses_the_size_it_is_given() -> None:
    step = {"heldout_accuracy": 0.0}
    small = Guard(3, "stop", 0, detector=CollapseDetector(heldout_size=HeldoutSize(8, 1)))
    small.detector.observe_heldout(0, 0.125)
    assert small.after_step(3, step, 1).action == "go"
    large = Guard(3, "stop", 0, detector=CollapseDetector(heldout_size=HeldoutSize(200, 4)))
    large.detector.observe_heldout(0, 0.5)
    decision = large.after_step(3, {"heldout_accuracy": 0.2}, 1)
    assert decision.action == "stop"
    assert "200 problems x 4 samples; one-sided p = " in decision.reason


def test_replay_without_a_size_judges_no_held_out_drop() -> None:
    steps = [{"step": s} for s in range(1, 11)]
    assert replay(steps, {0: 0.9, 10: 0.0}) == []
    sized = replay(steps, {0: 0.9, 10: 0.0}, HeldoutSize(50, 1))
    assert [(e.signal, e.step) for e in sized] == [("heldout_drop", 10)]


def _run_folder(root: Path, problems: int) -> Path:
    root.mkdir()
    metrics = [{"step": s, "reward_mean": 0.5, "entropy": 0.3} for s in range(1, 4)]
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    evals = [
        {"step": s, "accuracy": a, "num_problems": problems, "samples": 1.0}
        for s, a in ((0, 0.125), (3, 0.0))
    ]
    (root / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    return root


def test_compare_weighs_the_drop_by_the_logged_evaluation_size(tmp_path: Path) -> None:
    """`gspo compare` replays the same detector: 8 problems is noise there too; the same
    accuracies over 1000 problems would not be."""
    problems = Problems(Console(file=io.StringIO()))
    small = load_run(_run_folder(tmp_path / "small", 8), problems)
    assert small is not None and small.heldout_size == HeldoutSize(8, 1)
    assert [i for i in detector_issues(small) if i.kind == "heldout_drop"] == []
    large = load_run(_run_folder(tmp_path / "large", 1000), problems)
    assert large is not None
    assert [i.kind for i in detector_issues(large)] == ["heldout_drop"]
