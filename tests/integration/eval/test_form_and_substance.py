"""Form and substance, end to end: `gspo eval` writes `answered` and `accuracy_any_form` into
results.json (and each sample's forms into samples.jsonl), and a one-step training run writes
them into metrics.jsonl and eval.jsonl and prints them on its last held-out line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gspo_cli.data.benchmarks import load_benchmark
from gspo_cli.eval.runner import EvalSettings, run_eval
from tests.support.fixed_engine import fixed_engine
from tests.support.helpers import run_cli

QUESTIONS = [("Compute 1+2.", "3"), ("Compute 2*2.", "4"), ("Compute 2*3.", "6")]
# Two samples per problem: strict avg@2 1/3, answered 1/2, right in any form 2/3.
COMPLETIONS = {
    "p0": ["\\boxed{3}", "Answer: 3"],
    "p1": ["The answer is 4.", "\\boxed{5}"],
    "p2": ["\\boxed{}", "\\boxed{6}"],
}


def test_eval_results_carry_answered_and_any_form(tmp_path: Path) -> None:
    data = tmp_path / "problems.jsonl"
    rows = [{"id": f"p{i}", "question": q, "answer": a} for i, (q, a) in enumerate(QUESTIONS)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_benchmark("custom", str(data))
    settings = EvalSettings("builtin:tiny-dense", "custom", samples=2, data=str(data))
    text = io.StringIO()
    results = run_eval(
        settings,
        tmp_path / "ev",
        console=Console(file=text, width=200),
        engine_factory=fixed_engine(problems, COMPLETIONS),
    )
    metrics = results["metrics"]
    assert metrics["avg@2"]["value"] == pytest.approx(1 / 3)
    assert metrics["answered"]["value"] == pytest.approx(1 / 2)
    assert metrics["accuracy_any_form"]["value"] == pytest.approx(2 / 3)
    for name in ("answered", "accuracy_any_form"):
        assert metrics[name]["ci_low"] <= metrics[name]["value"] <= metrics[name]["ci_high"]
    on_disk = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert on_disk["metrics"]["accuracy_any_form"] == metrics["accuracy_any_form"]
    samples = [
        json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().split("\n") if x
    ]
    assert samples[1]["forms"] == ["marker", "boxed"]
    assert samples[1]["correct_any_form"] == [True, False]
    assert samples[2]["answered"] == [False, True]
    assert "accuracy_any_form" in text.getvalue() and "answered" in text.getvalue()


def test_a_training_run_logs_the_forms(tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # the tiny task's solutions end "Answer: N" half the time (unboxed_rate 0.5)
    recipe = tiny_recipe(trainer={"steps": 1})
    out = tmp_path / "run"
    result = run_cli("train", str(recipe), "--out", str(out))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.0 <= step["answered"] <= 1.0
    assert step["accuracy"] <= step["accuracy_any_form"] <= 1.0
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1]
    for record in evals:
        assert record["accuracy"] <= record["accuracy_any_form"]
        assert record["answered_ci_low"] <= record["answered"] <= record["answered_ci_high"]
        low, high = record["accuracy_any_form_ci_low"], record["accuracy_any_form_ci_high"]
        assert low <= record["accuracy_any_form"] <= high
    last = evals[-1]
    expected = f"answered {evals[0]['answered']:.1%} -> {last['answered']:.1%}; any form "
    assert expected in result.stdout, result.stdout[-2000:]
