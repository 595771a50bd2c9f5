"""`gspo eval` end to end on the real benchmark files in ../shared (tiny models, --limit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_cli.eval.metrics import pass_at_k
from tests.conftest import REPO, run_cli

QUICK = ("--samples", "2", "--max-new-tokens", "24", "--limit", "3")


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("eval", *args)


def _samples(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "benchmark,file",
    [
        ("aime24", "aime24/qwen25math_aime24_test.jsonl"),
        ("math500", "math500/deepscaler_math500_test.json"),
    ],
)
def test_maths_benchmark_end_to_end(
    shared: Path, sft_checkpoint: Path, tmp_path: Path, benchmark: str, file: str
) -> None:
    out = tmp_path / "ev"
    result = _eval(
        str(sft_checkpoint),
        "--benchmark",
        benchmark,
        "--data",
        str(shared / "benchmarks" / file),
        *QUICK,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    samples = _samples(out)
    assert results["benchmark"] == benchmark and results["problems"] == 3 == len(samples)
    assert results["sampling"]["samples"] == 2 and results["seed"] == 0
    counts = [sum(s["correct"]) for s in samples]
    metrics = results["metrics"]
    assert metrics["avg@2"]["value"] == pytest.approx(sum(counts) / 6)  # honest: near zero
    assert metrics["pass@2"]["value"] == pytest.approx(sum(pass_at_k(2, c, 2) for c in counts) / 3)
    for name in ("avg@2", "pass@1", "pass@2", "maj@2"):
        assert metrics[name]["ci_low"] <= metrics[name]["value"] <= metrics[name]["ci_high"]
    assert all(len(s["completions"]) == 2 and len(s["answers"]) == 2 for s in samples)
    assert "avg@2" in result.stdout


def test_livecodebench_judges_in_the_sandbox(shared: Path, tmp_path: Path) -> None:
    out = tmp_path / "lcb"
    data = shared / "benchmarks" / "livecodebench" / "sandboxfusion_lcb_v1_sample.decoded.jsonl"
    result = _eval(
        "builtin:tiny-dense",
        "--benchmark",
        "livecodebench",
        "--data",
        str(data),
        "--samples",
        "1",
        "--max-new-tokens",
        "16",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    samples = _samples(out)
    assert len(samples) == 3
    assert all(
        v in {"no_code", "syntax_error", "wrong_answer", "runtime_error"}
        for s in samples
        for v in s["verdicts"]
    )
    assert json.loads((out / "results.json").read_text())["metrics"]["avg@1"]["value"] == 0.0


def test_codeforces_names_its_elo_method(shared: Path, tmp_path: Path) -> None:
    out = tmp_path / "cf"
    data = shared / "benchmarks" / "codeforces" / "sandboxfusion_code_contests_sample.jsonl"
    result = _eval(
        "builtin:tiny-dense",
        "--benchmark",
        "codeforces",
        "--data",
        str(data),
        "--samples",
        "1",
        "--max-new-tokens",
        "8",
        "--limit",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    elo = json.loads((out / "results.json").read_text())["elo"]
    assert elo["value"] is None and "no problem ratings" in elo["method"]
    assert "elo (none" in result.stdout


def test_resume_skips_finished_problems_and_redoes_a_cut_line(shared: Path, tmp_path: Path) -> None:
    out = tmp_path / "ev"
    args = (
        "builtin:tiny-dense",
        "--benchmark",
        "aime24",
        "--data",
        str(shared / "benchmarks" / "aime24" / "qwen25math_aime24_test.jsonl"),
        *QUICK,
        "--out",
        str(out),
    )
    assert _eval(*args).returncode == 0
    first = (out / "results.json").read_text()
    again = _eval(*args)
    assert again.returncode == 2 and "--resume" in again.stderr  # never overwrites silently
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text(
        "\n".join(lines[:2]) + "\n" + lines[2][:20]
    )  # a kill mid-write
    resumed = _eval(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "2 already done" in resumed.stdout
    assert json.loads((out / "results.json").read_text())["metrics"] == json.loads(first)["metrics"]
    changed = _eval(*args[:-2], "--samples", "1", "--out", str(out), "--resume")
    assert changed.returncode == 2 and "settings differ" in changed.stderr


def test_run_folder_resolves_to_its_checkpoint(
    shared: Path, sft_checkpoint: Path, tmp_path: Path
) -> None:
    run_folder = sft_checkpoint.parent  # holds cold_start/
    result = _eval(
        str(run_folder),
        "--benchmark",
        "gsm8k",
        "--data",
        str(shared / "benchmarks" / "gsm8k" / "qwen25math_gsm8k_test.jsonl"),
        *QUICK,
        "--out",
        str(tmp_path / "g"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "g" / "results.json").read_text())["checkpoint"] == str(
        sft_checkpoint
    )


def test_hub_id_without_network_names_the_data_option(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GSPO_BENCHMARKS_DIR"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gspo_cli.cli",
            "eval",
            "builtin:tiny-dense",
            "--benchmark",
            "aime24",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
        timeout=300,
    )
    assert result.returncode == 2
    assert "--data" in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


def test_bad_checkpoint_and_unknown_benchmark_exit_2(tmp_path: Path) -> None:
    result = _eval(str(tmp_path), "--benchmark", "aime24")
    assert result.returncode == 2 and "neither an HF checkpoint" in result.stderr
    result = _eval("builtin:tiny-dense", "--benchmark", "nope")
    assert result.returncode == 2 and "known:" in result.stderr
