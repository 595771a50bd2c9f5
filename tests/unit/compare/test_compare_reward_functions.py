"""`gspo compare` shows each reward function's own curve (`reward/<name>/mean`) by default:
a table row with its final value (and difference against the baseline) and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo_cli.compare import compare_runs
from tests.support.compare_runs import console_text, metrics_row, recording_console, write_run


def _runs(root: Path) -> list[Path]:
    gspo = [
        metrics_row(s, 0.5, 1.0, **{"reward/length/mean": 0.2 + 0.01 * s}) for s in range(1, 11)
    ]
    grpo = [metrics_row(s, 0.4, 1.0, **{"reward/length/mean": 0.1}) for s in range(1, 11)]
    plain = [metrics_row(s, 0.3, 1.0) for s in range(1, 11)]  # a run from before per-function means
    return [
        write_run(root, "gspo", gspo),
        write_run(root, "grpo", grpo, algorithm="grpo"),
        write_run(root, "plain", plain),
    ]


def test_each_reward_function_gets_a_row_and_a_plot(tmp_path: Path) -> None:
    out, console = tmp_path / "out", recording_console()
    assert compare_runs(_runs(tmp_path / "runs"), out=out, console=console) == 0
    row = next(line for line in console_text(console).splitlines() if "reward/length/mean" in line)
    assert "final reward/length/mean" in row and "0.300" in row and "0.100 (-0.200)" in row
    assert [cell.strip() for cell in row.split("│")][-2] == "—"  # the run without it
    assert (out / "reward_length_mean.png").is_file()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    gspo = next(r for r in summary["runs"] if r["name"] == "gspo")
    assert gspo["reward/length/mean_final"] == pytest.approx(0.3)


def test_metrics_can_select_a_reward_function(tmp_path: Path) -> None:
    out, console = tmp_path / "out", recording_console()
    compare_runs(_runs(tmp_path / "runs"), metrics=["reward/length/mean"], out=out, console=console)
    assert {p.name for p in out.glob("*.png")} == {"reward_length_mean.png"}
    text = console_text(console)
    assert "final reward/length/mean" in text and "final reward " not in text
