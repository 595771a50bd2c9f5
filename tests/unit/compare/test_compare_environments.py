"""`gspo compare` on runs of several environments: a row and a plot of each environment's
held-out accuracy (eval.jsonl's env/NAME/accuracy) and of its training reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo_cli.compare import compare_runs
from tests.support.compare_runs import console_text, metrics_row, recording_console, write_run


def _mixture(root: Path, name: str, chain: float) -> Path:
    rows = [
        metrics_row(s, 0.5, 1.0, **{"env/sums/reward_mean": 0.4, "env/chain/reward_mean": chain})
        for s in range(1, 5)
    ]
    run = write_run(root, name, rows, evals={0: 0.2, 4: 0.3})
    records = [
        {"step": 0, "accuracy": 0.2, "env/sums/accuracy": 0.25, "env/chain/accuracy": 0.05},
        {"step": 4, "accuracy": 0.3, "env/sums/accuracy": 0.35, "env/chain/accuracy": chain},
    ]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_each_environment_gets_held_out_and_reward_rows_and_plots(tmp_path: Path) -> None:
    runs = [_mixture(tmp_path / "runs", "uniform", 0.1), _mixture(tmp_path / "runs", "cur", 0.2)]
    out, console = tmp_path / "out", recording_console()
    assert compare_runs(runs, out=out, console=console) == 0
    lines = console_text(console).splitlines()
    chain = next(line for line in lines if "held-out chain first" in line)
    assert "5.0% → 10.0%" in chain and "5.0% → 20.0%" in chain
    assert any("final env/sums/reward_mean" in line for line in lines)
    plots = {p.name for p in out.glob("*.png")}
    assert {"heldout_env_chain_accuracy.png", "heldout_env_sums_accuracy.png"} <= plots
    assert "env_chain_reward_mean.png" in plots
    summary = json.loads((out / "summary.json").read_text())
    cur = next(r for r in summary["runs"] if r["name"] == "cur")
    assert cur["heldout_env/chain/accuracy_last"] == pytest.approx(0.2)
