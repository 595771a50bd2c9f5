"""`gspo eval` on the real benchmark files in ../shared (tiny models, --limit).

One maths test runs the real CLI in a subprocess; the rest call `run_eval` in-process, and the
code benchmarks get a scripted engine (one right and one wrong program per problem) so that the
sandbox verdicts and the Elo estimates come from real judging, not from `no_code`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.data.benchmarks import load_benchmark
from gspo_cli.eval.metrics import pass_at_k
from gspo_cli.eval.runner import EngineFactory, EvalSettings, run_eval
from gspo_cli.eval.summary import codeforces_elo
from gspo_cli.rollout.hf import HFGenerateEngine
from tests.support.fixed_engine import fixed_engine
from tests.support.helpers import BAD, GOOD, REPO, SMALLEST_SHUFFLE, TSHIRTS, fenced, run_cli

QUICK = ("--samples", "2", "--max-new-tokens", "24", "--limit", "3")


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("eval", *args)


def _samples(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]


@pytest.mark.container  # a short eval run, in the container too
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


def _run_eval(
    settings: EvalSettings,
    out: Path,
    *,
    resume: bool = False,
    engine_factory: EngineFactory = HFGenerateEngine,
) -> tuple[dict[str, Any], str]:
    """`run_eval` in-process (no interpreter start-up); returns the results and what it printed."""
    text = io.StringIO()
    console = Console(file=text, width=200)
    results = run_eval(settings, out, resume=resume, console=console, engine_factory=engine_factory)
    return results, text.getvalue()


def _judged(
    shared: Path, settings: EvalSettings, out: Path, programs: dict[str, tuple[str, str]]
) -> tuple[dict[str, Any], str]:
    """Evaluate with a scripted engine: each problem's samples alternate right, wrong."""
    problems = load_benchmark(settings.benchmark, settings.data, limit=settings.limit)
    answers = {pid: [fenced(good), fenced(bad)] for pid, (good, bad) in programs.items()}
    return _run_eval(settings, out, engine_factory=fixed_engine(problems, answers))


def _assert_one_right_one_wrong(results: dict[str, Any], samples: list[dict], n: int) -> None:  # type: ignore[type-arg]
    assert results["problems"] == n == len(samples)
    assert all(s["verdicts"] == ["accepted", "wrong_answer"] for s in samples), [
        s["verdicts"] for s in samples
    ]
    metrics = results["metrics"]
    assert metrics["avg@2"]["value"] == 0.5 and metrics["pass@1"]["value"] == 0.5
    assert metrics["pass@2"]["value"] == 1.0
    assert metrics["avg@2"]["ci_low"] == metrics["avg@2"]["ci_high"] == 0.5  # every rate is 1/2


@pytest.mark.container  # the sandbox judging programs, in the container too
def test_livecodebench_judges_right_and_wrong_programs_in_the_sandbox(
    shared: Path, tmp_path: Path
) -> None:
    data = shared / "benchmarks" / "livecodebench" / "sandboxfusion_lcb_v1_sample.decoded.jsonl"
    settings = EvalSettings("builtin:tiny-dense", "livecodebench", samples=2, data=str(data))
    programs = {pid: (GOOD[pid], BAD[pid]) for pid in GOOD}  # stdin, stdin and call-style tests
    results, printed = _judged(shared, settings, tmp_path / "lcb", programs)
    _assert_one_right_one_wrong(results, _samples(tmp_path / "lcb"), 3)
    assert "elo" not in results and "pass@2" in printed


# rllm's CodeElo rows 0 ("min and max") and 2 ("clock strings"): answers that are unique.
MIN_MAX = """\
for _ in range(int(input())):
    x, y = map(int, input().split())
    print(min(x, y), max(x, y))
"""
CLOCK = """\
for _ in range(int(input())):
    a, b, c, d = map(int, input().split())
    lo, hi = min(a, b), max(a, b)
    print("YES" if (lo < c < hi) != (lo < d < hi) else "NO")
"""


def test_codeforces_elo_from_problem_ratings(shared: Path, tmp_path: Path) -> None:
    source = shared / "benchmarks" / "codeforces" / "rllm_codeelo_test_codeforces.json"
    rows = json.loads(source.read_text())
    data = tmp_path / "rated.json"  # the file has no ratings: give the two problems 800 and 1200
    data.write_text(json.dumps([{**rows[0], "rating": 800}, {**rows[2], "rating": 1200}]))
    settings = EvalSettings("builtin:tiny-dense", "codeforces", samples=2, data=str(data))
    programs = {
        "codeelo-0": (MIN_MAX, MIN_MAX.replace("min(x, y), max(x, y)", "x, y")),
        "codeelo-1": (CLOCK, CLOCK.replace('"YES" if', '"NO" if')),
    }
    results, printed = _judged(shared, settings, tmp_path / "cf", programs)
    _assert_one_right_one_wrong(results, _samples(tmp_path / "cf"), 2)
    elo = results["elo"]
    assert elo["method"] == "problem-rating maximum likelihood" and elo["problems"] == 2
    # half of each solved: by symmetry the MLE sits midway between the two ratings
    assert math.isfinite(elo["value"]) and elo["value"] == pytest.approx(1000, abs=1)
    assert elo["ci_low"] <= elo["value"] <= elo["ci_high"]
    assert "elo (problem-rating maximum likelihood)" in printed


def _standings(middle: tuple[float, float, float]) -> dict[str, Any]:
    """A points contest (A 500, B 1000) of three rated humans scoring `middle` in order."""
    return {
        "type": "points",
        "problems": [{"index": "A", "points": 500}, {"index": "B", "points": 1000}],
        "participants": [
            {"score": score, "old_rating": rating}
            for score, rating in zip(middle, (1900, 1500, 1100), strict=True)
        ],
    }


def _code_contests_rows(shared: Path, names: tuple[str, ...]) -> str:
    path = shared / "benchmarks" / "codeforces" / "sandboxfusion_code_contests_sample.jsonl"
    lines = path.read_text().splitlines()
    return "\n".join(x for x in lines if json.loads(json.loads(x)["labels"])["name"] in names)


@pytest.mark.slow
def test_codeforces_codeelo_rating_from_a_standings_cache(shared: Path, tmp_path: Path) -> None:
    data = tmp_path / "cf.jsonl"
    data.write_text(
        _code_contests_rows(shared, ("1000_A. Codehorses T-shirts", "12_B. Correct Solution?"))
    )
    # the model's score (500 in 1000, 1000 in 12) ties the 1500-rated human of each contest:
    # rank 2.5 among ratings symmetric about 1500 gives exactly 1500
    standings = tmp_path / "standings.json"
    standings.write_text(
        json.dumps(
            [
                {"id": 1000, **_standings((1500, 500, 0))},
                {"id": 12, **_standings((1500, 1000, 500))},
            ]
        )
    )
    settings = EvalSettings(
        "builtin:tiny-dense", "codeforces", samples=2, data=str(data), standings=str(standings)
    )
    programs = {
        "codeforces/1000_A": (TSHIRTS, TSHIRTS.replace("print(sum(", "print(1 + sum(")),
        "codeforces/12_B": (SMALLEST_SHUFFLE, "input()\ninput()\nprint('OK')\n"),
    }
    results, printed = _judged(shared, settings, tmp_path / "cf", programs)
    samples = _samples(tmp_path / "cf")
    _assert_one_right_one_wrong(results, samples, 2)
    elo = results["elo"]
    assert elo["method"].startswith("codeelo") and elo["contests"] == 2
    assert math.isfinite(elo["value"]) and elo["value"] == pytest.approx(1500, abs=1)
    assert elo["attempts_per_problem"] == 2 and "elo (codeelo" in printed
    no_ratings = codeforces_elo(samples, 2, None, 0)  # CodeContests rows carry no rating
    assert no_ratings["value"] is None and "no problem ratings" in no_ratings["method"]


def test_resume_skips_finished_problems_and_redoes_a_cut_line(shared: Path, tmp_path: Path) -> None:
    out = tmp_path / "ev"
    data = shared / "benchmarks" / "aime24" / "qwen25math_aime24_test.jsonl"
    settings = EvalSettings(
        "builtin:tiny-dense", "aime24", samples=2, max_new_tokens=24, limit=3, data=str(data)
    )
    _run_eval(settings, out)
    first = json.loads((out / "results.json").read_text())
    with pytest.raises(GspoError, match="--resume"):  # never overwrites silently
        _run_eval(settings, out)
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text(
        "\n".join(lines[:2]) + "\n" + lines[2][:20]
    )  # a kill mid-write
    resumed, printed = _run_eval(settings, out, resume=True)
    assert "2 already done" in printed
    assert resumed["metrics"] == first["metrics"]
    changed = dataclasses.replace(settings, samples=1)
    with pytest.raises(GspoError, match="settings differ"):
        _run_eval(changed, out, resume=True)
    typo = tmp_path / "evv"  # --resume of a folder with no evaluation: refused, nothing made
    with pytest.raises(GspoError, match=r"--resume: .*evv holds no evaluation"):
        _run_eval(settings, typo, resume=True)
    assert not typo.exists()


def test_run_folder_resolves_to_its_checkpoint(
    shared: Path, sft_checkpoint: Path, tmp_path: Path
) -> None:
    data = shared / "benchmarks" / "gsm8k" / "qwen25math_gsm8k_test.jsonl"
    settings = EvalSettings(
        str(sft_checkpoint.parent),  # the run folder: holds cold_start/
        "gsm8k",
        samples=2,
        max_new_tokens=24,
        limit=3,
        data=str(data),
    )
    results, _ = _run_eval(settings, tmp_path / "g")
    assert results["checkpoint"] == str(sft_checkpoint)


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


@pytest.mark.slow
def test_bad_checkpoint_and_unknown_benchmark_exit_2(tmp_path: Path) -> None:
    result = _eval(str(tmp_path), "--benchmark", "aime24")
    assert result.returncode == 2 and "neither an HF checkpoint" in result.stderr
    result = _eval("builtin:tiny-dense", "--benchmark", "nope")
    assert result.returncode == 2 and "known:" in result.stderr
