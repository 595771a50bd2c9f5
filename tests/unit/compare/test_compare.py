"""`gspo compare` on fixture run folders written from Python: table numbers, verdicts, plots,
summary files, and the handling of corrupt lines and folders that are not runs."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gspo_cli.compare import compare_runs
from gspo_cli.compare.results import parse_entry
from gspo_cli.compare.runs import Problems, load_runs
from gspo_cli.compare.series import Series, smooth
from gspo_cli.compare.stats import Comparison, compare
from tests.support.compare_runs import (
    console_text,
    metrics_row,
    png_size,
    recording_console,
    write_run,
)


def gspo_run(root: Path) -> Path:
    """40/40 steps, reward 0.3 + 0.01 step, MoE (expert volatility), one `gspo eval` result."""
    rows = [
        metrics_row(s, 0.3 + 0.01 * s, 1.0 - 0.005 * s, expert_volatility=0.1) for s in range(1, 41)
    ]
    run = write_run(
        root, "gspo-moe", rows, model="builtin:tiny-moe", evals={0: 0.2, 20: 0.35, 40: 0.5}
    )
    (run / "eval" / "aime24").mkdir(parents=True)
    result = {
        "benchmark": "aime24",
        "checkpoint": str(run / "final"),
        "metrics": {"pass@1": {"value": 0.4, "ci_low": 0.3, "ci_high": 0.5}, "maj@8": 0.45},
    }
    (run / "eval" / "aime24" / "results.json").write_text(json.dumps(result), encoding="utf-8")
    return run


def grpo_run(root: Path) -> Path:
    """In progress (30 of 60 steps), logged every 2 steps, 600 tokens per step."""
    rows = [
        metrics_row(s, 0.3 + 0.005 * s, 0.9, clip_frac=0.0013, clip_frac_low=0.0006,
                    clip_frac_high=0.0007, completion_tokens=600, tokens_per_s=800.0)
        for s in range(2, 31, 2)
    ]  # fmt: skip
    return write_run(root, "grpo", rows, algorithm="grpo", planned=60, evals={0: 0.2, 30: 0.3})


def collapse_run(root: Path) -> Path:
    """Reward climbs to 0.68 by step 24, then collapses to 0.05 from step 25 on."""
    rows = [metrics_row(s, 0.2 + 0.02 * s if s < 25 else 0.05, 1.0) for s in range(1, 51)]
    return write_run(root, "collapse", rows, planned=50)


def nan_run(root: Path) -> Path:
    """loss NaN and grad_norm inf first at step 17 (reward NaN from step 18)."""
    rows = [metrics_row(s, 0.5, 1.0) for s in range(1, 31)]
    rows[16].update(loss="nan", grad_norm="inf")
    for row in rows[17:]:
        row.update(loss="nan", reward_mean="nan")
    return write_run(root, "nan", rows, planned=30)


def entropy_run(root: Path) -> Path:
    """Entropy 1.0, then 0.05 (5% of initial) from step 20."""
    rows = [metrics_row(s, 0.5 + 0.005 * s, 1.0 if s < 20 else 0.05) for s in range(1, 31)]
    return write_run(root, "entropy", rows, planned=30)


def noisy_run(root: Path) -> Path:
    """Healthy but noisy: a plateau at 0.6 with +-0.1 noise and entropy drifting down by half."""
    rows = [metrics_row(s, 0.6 + 0.1 * math.sin(1.7 * s), 1.0 - 0.01 * s) for s in range(1, 51)]
    return write_run(root, "noisy", rows, planned=50)


def _compare(paths: list[Path], **kwargs: Any) -> Comparison:
    problems = Problems(recording_console())
    runs, base = load_runs(paths, kwargs.pop("baseline", None), problems)
    assert base is not None
    return compare(runs, base, kwargs.get("x", "step"), kwargs.get("smooth", 1), None)


def _stats(cmp: Comparison, name: str) -> dict[str, Any]:
    return next(r.stats for r in cmp.reports if r.run.name == name)


@pytest.fixture
def pair(tmp_path: Path) -> list[Path]:
    return [gspo_run(tmp_path / "runs"), grpo_run(tmp_path / "runs")]


def test_table_numbers(pair: list[Path]) -> None:
    cmp = _compare(pair)
    gspo, grpo = _stats(cmp, "gspo-moe"), _stats(cmp, "grpo")
    assert gspo["final_reward"] == pytest.approx(0.7)
    assert (gspo["best_reward"], gspo["best_reward_step"]) == (pytest.approx(0.7), 40)
    assert gspo["clip_frac_mean"] == pytest.approx(0.15)
    assert gspo["clip_frac_low_mean"] == pytest.approx(0.05)
    assert gspo["ratio_spread_mean"] == pytest.approx(0.004)
    assert (gspo["heldout_first"], gspo["heldout_last"]) == (0.2, 0.5)
    assert gspo["heldout_best_step"] == 40
    assert gspo["eval"]["aime24 pass@1"]["ci_low"] == 0.3
    assert gspo["eval"]["aime24 maj@8"]["value"] == 0.45
    assert (grpo["steps_done"], grpo["steps_planned"]) == (30, 60)
    assert grpo["final_reward"] == pytest.approx(0.45)
    assert grpo["clip_frac_mean"] == pytest.approx(0.0013)
    assert (grpo["heldout_first"], grpo["heldout_last"]) == (0.2, 0.3)
    # Aligned on steps: both runs reached step 30.
    assert cmp.common_x == 30
    assert gspo["reward_at_common_x"] == pytest.approx(0.6)
    grpo_report = next(r for r in cmp.reports if r.run.name == "grpo")
    assert grpo_report.deltas["final_reward"] == pytest.approx(-0.25)
    assert grpo_report.deltas["heldout_last"] == pytest.approx(-0.2)


def test_smoothing_and_token_axis(pair: list[Path]) -> None:
    smoothed = _stats(_compare(pair, smooth=5), "gspo-moe")
    assert smoothed["final_reward"] == pytest.approx(0.68)  # mean of steps 36..40
    cmp = _compare(pair, x="tokens")
    # grpo: 15 records x 2 steps x 600 tokens; gspo reaches 18000 tokens at step 35.156.
    assert cmp.common_x == pytest.approx(18000)
    assert _stats(cmp, "gspo-moe")["reward_at_common_x"] == pytest.approx(0.3 + 0.01 * 18000 / 512)


def test_baseline_option(pair: list[Path]) -> None:
    cmp = _compare(pair, baseline=pair[1])
    assert cmp.baseline.run.name == "grpo"
    assert cmp.reports[0].deltas["final_reward"] == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        # The smoothed-curve verdict and the trainer's detector (3-step mean) both see it.
        (collapse_run, [("reward_collapse", 25), ("reward_crash", 26)]),
        (nan_run, [("non_finite", 17)]),
        (entropy_run, [("entropy_collapse", 20)]),
    ],
)
def test_verdicts_find_planted_step(
    tmp_path: Path, make: Callable[[Path], Path], expected: list[tuple[str, int]]
) -> None:
    cmp = _compare([make(tmp_path)])
    issues = cmp.reports[0].issues
    assert [(i.kind, i.step) for i in issues] == expected
    assert f"step {expected[0][1]}" in issues[0].detail


def test_the_trainers_detector_calls_an_exploding_entropy_unstable(tmp_path: Path) -> None:
    """What lr=1000 does to the tiny model: entropy 0.17 -> 4.6 nats, reward to 0."""
    rows = [metrics_row(s, 0.5, 0.17) for s in range(1, 11)]
    rows += [metrics_row(s, 0.02, 4.6) for s in range(11, 21)]
    cmp = _compare([write_run(tmp_path, "lr1000", rows, planned=20)])
    kinds = {i.kind for i in cmp.reports[0].issues}
    assert "entropy_explosion" in kinds  # so the verdict is not "stable"


def test_recorded_guard_events_are_shown(tmp_path: Path) -> None:
    run = write_run(
        tmp_path, "guarded", [metrics_row(s, 0.5, 1.0) for s in range(1, 11)], planned=10
    )
    (run / "events.jsonl").write_text(
        '{"step": 7, "action": "rollback", "signal": "entropy_explosion", "detail": "to step 5"}\n'
    )
    issues = _compare([run]).reports[0].issues
    assert [(i.kind, i.step) for i in issues] == [("rollback", 7)]


def test_healthy_runs_are_stable(tmp_path: Path, pair: list[Path]) -> None:
    cmp = _compare([*pair, noisy_run(tmp_path)])
    assert [r.issues for r in cmp.reports] == [[], [], []]


def test_full_comparison_writes_plots_and_summaries(tmp_path: Path, pair: list[Path]) -> None:
    runs = [*pair, collapse_run(tmp_path / "runs"), nan_run(tmp_path / "runs")]
    out, console = tmp_path / "out", recording_console()
    assert compare_runs(runs, metrics=None, out=out, baseline=None, console=console) == 0
    text = console_text(console)
    assert "0.700" in text and "20.0% → 50.0%" in text
    assert "15.00% (low 5.00% / high 10.00%)" in text
    assert "0.400 [0.300, 0.500]" in text and "reward collapse at step 25" in text
    # The MoE run shows its volatility and routing-replay setting; the dense runs show neither.
    volatility = next(line for line in text.splitlines() if "expert volatility / update" in line)
    replay = next(line for line in text.splitlines() if "routing replay" in line)
    assert "10.00%" in volatility and replay.count("off") == 1
    expected = {
        "reward_mean", "heldout_accuracy", "clip_frac", "ratio_spread", "entropy",
        "grad_norm", "response_len_mean", "expert_volatility",
    }  # fmt: skip
    pngs = sorted(out.glob("*.png"))
    assert {p.stem for p in pngs} == expected
    assert all(png_size(p) == (800, 450) for p in pngs)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    by_name = {r["name"]: r for r in summary["runs"]}
    assert by_name["gspo-moe"]["final_reward"] == pytest.approx(0.7)
    assert by_name["gspo-moe"]["baseline"] and by_name["gspo-moe"]["verdict"] == "stable"
    assert by_name["nan"]["issues"][0] == {
        "kind": "non_finite",
        "step": 17,
        "detail": "NaN/inf at step 17 (loss=nan, grad_norm=inf)",
    }
    assert by_name["collapse"]["issues"][0]["step"] == 25
    assert by_name["grpo"]["delta_vs_baseline"]["final_reward"] == pytest.approx(-0.25)
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert all(f"![{p.stem}]({p.name})" in md for p in pngs)
    assert "| final reward | 0.700 |" in md


def test_metrics_restrict_plots_and_rows(tmp_path: Path, pair: list[Path]) -> None:
    out, console = tmp_path / "out", recording_console()
    compare_runs(pair, metrics=["reward_mean,clip_frac"], out=out, baseline=None, console=console)
    assert {p.name for p in out.glob("*.png")} == {"reward_mean.png", "clip_frac.png"}
    text = console_text(console)
    assert "clip fraction" in text and "entropy mean" not in text and "held-out" not in text
    # A second comparison into the same folder removes the plots it no longer draws.
    compare_runs(pair, metrics=["entropy"], out=out, baseline=None, console=recording_console())
    assert {p.name for p in out.glob("*.png")} == {"entropy.png"}


def test_no_moe_run_means_no_volatility_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    runs = [grpo_run(tmp_path)]
    assert (
        compare_runs(runs, metrics=None, out=out, baseline=None, console=recording_console()) == 0
    )
    assert not (out / "expert_volatility.png").exists()
    assert (out / "reward_mean.png").exists()


def test_corrupt_line_is_reported_and_rest_compared(tmp_path: Path, pair: list[Path]) -> None:
    metrics = pair[0] / "metrics.jsonl"
    with metrics.open("a", encoding="utf-8") as f:
        f.write('{"step": 41, "loss": 0.0')  # cut by a kill
    console = recording_console()
    code = compare_runs(pair, metrics=["reward_mean"], out=tmp_path / "o", baseline=None,
                        console=console)  # fmt: skip
    assert code == 0
    lines = [line for line in console_text(console).splitlines() if line.startswith("warning:")]
    assert lines == [f"warning: {metrics}:41: corrupt line skipped (not a JSON record)"]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    assert summary["runs"][0]["steps_done"] == 40
    assert summary["runs"][0]["final_reward"] == pytest.approx(0.7)


def test_non_run_folder_is_named_and_skipped(tmp_path: Path, pair: list[Path]) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.txt").write_text("not a run", encoding="utf-8")
    console = recording_console()
    code = compare_runs([notes, *pair], metrics=["reward_mean"], out=tmp_path / "o",
                        baseline=None, console=console)  # fmt: skip
    assert code == 0
    errors = [line for line in console_text(console).splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {notes}: not a run folder (no metrics.jsonl or recipe.yaml); skipped"
    ]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    assert [r["name"] for r in summary["runs"]] == ["gspo-moe", "grpo"]
    assert summary["baseline"] == "gspo-moe"


def test_all_invalid_returns_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"step": 1, "lo\nnot json\n', encoding="utf-8")
    console = recording_console()
    code = compare_runs([empty, broken], metrics=None, out=tmp_path / "o",
                        baseline=None, console=console)  # fmt: skip
    assert code == 2
    text = console_text(console)
    for path in (empty, broken / "metrics.jsonl"):
        assert f"error: {path}: " in text
    assert f"{broken / 'metrics.jsonl'}:2: corrupt line" in text
    assert not (tmp_path / "o").exists()


def test_bad_axis_returns_2(pair: list[Path], tmp_path: Path) -> None:
    console = recording_console()
    assert compare_runs(pair, x="epochs", out=tmp_path / "o", console=console) == 2
    assert "error: --x: unknown axis 'epochs'" in console_text(console)


def test_smooth_is_trailing_over_steps_and_ignores_nan() -> None:
    series = Series(np.array([1, 2, 3, 4, 10]), np.array([1.0, math.nan, 3.0, math.inf, 5.0]))
    assert smooth(series, 2).values.tolist() == [1.0, 1.0, 3.0, 3.0, 5.0]
    assert smooth(series, 3).values.tolist() == [1.0, 1.0, 2.0, 3.0, 5.0]


@pytest.mark.parametrize(
    ("entry", "parsed"),
    [
        (0.5, (0.5, None, None)),
        ({"value": 0.5, "ci_low": 0.4, "ci_high": 0.6}, (0.5, 0.4, 0.6)),
        ({"mean": 0.5, "ci": [0.4, 0.6]}, (0.5, 0.4, 0.6)),
        ({"score": 1500, "low": 1400, "high": 1600}, (1500.0, 1400.0, 1600.0)),
        ({"value": 0.5, "ci_low": "?"}, (0.5, None, None)),
        ([0.1, 0.2], None),
        (True, None),
    ],
)
def test_eval_result_entries_are_read_leniently(entry: Any, parsed: Any) -> None:
    assert parse_entry(entry) == parsed


def test_tool_runs_show_their_calls_and_runs_without_tools_do_not(tmp_path: Path) -> None:
    rows = [
        metrics_row(s, 0.3, 1.0, tool_calls_per_response=0.5 + 0.1 * s, tool_error_frac=0.2)
        for s in range(1, 5)
    ]
    tools, plain = write_run(tmp_path, "tools", rows), grpo_run(tmp_path)
    out, console = tmp_path / "out", recording_console()
    assert compare_runs([tools, plain], out=out, console=console) == 0
    assert _stats(_compare([tools, plain]), "tools")[
        "tool_calls_per_response_mean"
    ] == pytest.approx(0.75)
    text = console_text(console)
    assert "tool calls / response" in text and "0.75" in text and "20.0%" in text
    assert (out / "tool_calls_per_response.png").exists()
    out_plain = tmp_path / "plain"
    assert compare_runs([plain], out=out_plain, console=recording_console()) == 0
    assert not (out_plain / "tool_calls_per_response.png").exists()


def test_a_hacked_judge_shows_as_the_two_judges_parting(tmp_path: Path) -> None:
    rows = [metrics_row(s, 0.3, 1.0) for s in range(1, 7)]
    for row, (train, heldout) in zip(rows[1::2], ((0.4, 0.5), (0.6, 0.4), (0.8, 0.3)), strict=True):
        row.update({"judge_train/mean": train, "judge_heldout/mean": heldout})
    run = write_run(tmp_path, "judged", rows)
    out, console = tmp_path / "out", recording_console()
    assert compare_runs([run], out=out, console=console) == 0
    text = console_text(console)
    assert "judge train first → last" in text and "0.400 → 0.800" in text
    assert "judge heldout first → last" in text and "0.500 → 0.300" in text
    assert (out / "judge_heldout_mean.png").exists() or any(out.glob("judge_heldout*.png"))


def test_out_never_replaces_files_a_comparison_did_not_write(
    tmp_path: Path, pair: list[Path]
) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "summary.md").write_text("my own notes\n", encoding="utf-8")
    console = recording_console()
    assert compare_runs(pair, out=mine, console=console) == 2
    assert "holds files gspo compare did not write" in console_text(console)
    assert [p.name for p in mine.iterdir()] == ["summary.md"]
    assert (mine / "summary.md").read_text(encoding="utf-8") == "my own notes\n"
    again = tmp_path / "cmp"  # a comparison's own folder is reused, as DEFAULT_OUT is
    for _ in range(2):
        assert compare_runs(pair, out=again, console=recording_console()) == 0
