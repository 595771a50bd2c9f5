"""Form and substance in every report, from scripted data: `answered` and `accuracy_any_form`
(maths) or `ran_clean` (code) beside strict accuracy in eval's metrics, held-out evaluation
(eval.jsonl), a training step's metrics (metrics.jsonl), the run's last console line and
`gspo compare` (table, summary.json, plots)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gspo_cli.compare import compare_runs
from gspo_cli.data import render_prompt
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import PLAIN
from gspo_cli.eval.metrics import bootstrap_ci
from gspo_cli.eval.summary import summarize
from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.recipe.reward import RewardConfig
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.train.run.console import heldout_change
from gspo_cli.train.run.heldout import heldout_accuracy
from gspo_cli.train.step.collection import collect_groups
from gspo_cli.train.step.metrics import form_metrics
from gspo_cli.train.step.rewards import WeightedRewards
from gspo_cli.train.step.scored import concat_groups, select_groups
from tests.support.compare_runs import console_text, metrics_row, recording_console, write_run
from tests.support.fixed_engine import FixedRolloutEngine
from tests.support.rl_helpers import tiny_step


@pytest.fixture(scope="module")
def pool() -> Iterator[MathVerifierPool]:
    with MathVerifierPool(1, 5.0) as verifier:
        yield verifier


def _record(correct: list[bool], **flags: list[bool]) -> dict[str, Any]:
    n = len(correct)
    return {"correct": correct, "answers": ["1"] * n, "lengths": [5] * n,
            "truncated": [False] * n, **flags}  # fmt: skip


def test_summarize_adds_the_forms_as_avg_at_k_with_the_same_interval() -> None:
    records = [
        _record([True, False], answered=[True, False], correct_any_form=[True, True]),
        _record([False, False], answered=[False, False], correct_any_form=[True, False]),
        _record([False, False], answered=[True, True], correct_any_form=[False, False]),
    ]
    metrics = summarize(records, 2, "math", seed=3)
    assert metrics["answered"]["value"] == pytest.approx(0.5)
    assert metrics["accuracy_any_form"]["value"] == pytest.approx(0.5)
    assert metrics["avg@2"]["value"] == pytest.approx(1 / 6)  # strict, as before
    low, high = bootstrap_ci([1.0, 0.5, 0.0], seed=3)  # any-form rates per problem
    assert (metrics["accuracy_any_form"]["ci_low"], metrics["accuracy_any_form"]["ci_high"]) == (
        pytest.approx(low),
        pytest.approx(high),
    )
    assert "ran_clean" not in metrics
    # an older record without the flags (a resumed evaluation): the metric is left out
    records[1] = _record([False, False])
    assert "answered" not in summarize(records, 2, "math", seed=3)


def test_summarize_code_reports_ran_clean() -> None:
    records = [
        _record([True, False], answered=[True, True], ran_clean=[True, True]),
        _record([False, False], answered=[True, False], ran_clean=[False, False]),
    ]
    metrics = summarize(records, 2, "code", seed=0)
    assert metrics["ran_clean"]["value"] == 0.5 and metrics["answered"]["value"] == 0.75
    assert "accuracy_any_form" not in metrics


def test_heldout_accuracy_logs_the_forms(pool: MathVerifierPool) -> None:
    tokenizer = build_char_tokenizer()
    problems = [
        Problem(id=str(i), benchmark="heldout", kind="math", question=q, answer=a)
        for i, (q, a) in enumerate([("Compute 1+2.", "3"), ("Compute 2*3.", "6")])
    ]
    answers = {  # problem 0: boxed right, marker right; problem 1: number wrong, boxed wrong
        tuple(render_prompt(tokenizer, problems[0].question)): ["\\boxed{3}", "Answer: 3"],
        tuple(render_prompt(tokenizer, problems[1].question)): ["so 5", "\\boxed{7}"],
    }
    values = heldout_accuracy(
        FixedRolloutEngine(tokenizer, answers),
        tokenizer,
        problems,
        SamplingParams(num_samples=2),
        seed=0,
        math_pool=pool,
        prompt_format=PLAIN,
    )
    assert values["accuracy"] == pytest.approx(0.25)
    assert values["answered"] == pytest.approx(0.5)
    assert values["accuracy_any_form"] == pytest.approx(0.5)
    assert values["accuracy_any_form_ci_low"] <= 0.5 <= values["accuracy_any_form_ci_high"]
    assert values["answered_ci_low"] <= 0.5 <= values["answered_ci_high"]


def test_a_training_step_measures_the_forms_and_keeps_them_through_selection(
    pool: MathVerifierPool,
) -> None:
    tokenizer = build_char_tokenizer()
    prompts = [list(render_prompt(tokenizer, q)) for q in ("Compute 1+2.", "Compute 2*2.")]
    texts = [["\\boxed{3}", "The answer is 3."], ["\\boxed{5}", "it is 4"]]
    answers = {tuple(p): t for p, t in zip(prompts, texts, strict=True)}
    engine = FixedRolloutEngine(tokenizer, answers)
    rows = [{"prompt": "Compute 1+2.", "answer": "3"}, {"prompt": "Compute 2*2.", "answer": "4"}]
    reward = WeightedRewards(RewardConfig(functions=[{"name": "math"}]), RewardServices(pool))
    step = tiny_step(sampling=SamplingParams(num_samples=2, max_new_tokens=64))
    scored = collect_groups(engine, reward, prompts, rows, step)
    assert scored.correct == [1.0, 0.0, 0.0, 0.0]
    assert scored.answered == [1.0, 0.0, 1.0, 0.0]
    assert scored.correct_any_form == [1.0, 1.0, 0.0, 1.0]
    assert form_metrics(scored) == {"answered": 0.5, "accuracy_any_form": 0.75}
    # dynamic sampling's selection and assembly carry them with their groups
    second = select_groups(scored, [1])
    assert second.answered == [1.0, 0.0] and second.correct_any_form == [0.0, 1.0]
    joined = concat_groups([second, select_groups(scored, [0])], {}, (0.0, 0.0))
    assert joined.correct_any_form == [0.0, 1.0, 1.0, 1.0]
    # a first function without an answer form: nothing measured, nothing reported
    other = WeightedRewards(RewardConfig(functions=[{"name": "environment"}]), RewardServices(pool))
    unmeasured = other(["\\boxed{3}"], [{"answer": "3", "environment_reward": 1.0}])
    assert unmeasured.answered is None and unmeasured.correct_any_form is None
    scored.answered = scored.correct_any_form = None
    assert form_metrics(scored) == {}


def test_the_last_console_line_shows_answered_and_any_form(tmp_path: Path) -> None:
    records = [
        {"step": 0, "accuracy": 0.2, "answered": 0.3, "accuracy_any_form": 0.5},
        {"step": 5, "accuracy": 0.6, "answered": 0.9, "accuracy_any_form": 0.62},
    ]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    line = heldout_change(tmp_path, {0: 0.2, 5: 0.6})
    assert line == (
        "held-out accuracy: before RL 20.0% -> after 5 steps 60.0% (+40.0 points); "
        "answered 30.0% -> 90.0%; any form 50.0% -> 62.0%"
    )
    # a run whose evaluations predate the forms: the accuracy alone
    (tmp_path / "eval.jsonl").write_text('{"step": 0, "accuracy": 0.2}\n')
    assert heldout_change(tmp_path, {0: 0.2, 5: 0.6}).endswith("(+40.0 points)")


def _with_forms(run: Path, forms: dict[int, tuple[float, float]]) -> None:
    """Add answered and accuracy_any_form to the run's eval.jsonl records, by step."""
    path = run / "eval.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        answered, any_form = forms[record["step"]]
        record.update(answered=answered, accuracy_any_form=any_form)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_compare_shows_the_forms_in_table_summary_and_plots(tmp_path: Path) -> None:
    rows = [metrics_row(s, 0.3, 1.0) for s in range(1, 11)]
    base = write_run(tmp_path, "base", rows, planned=10, evals={0: 0.2, 10: 0.4})
    _with_forms(base, {0: (0.3, 0.5), 10: (0.9, 0.55)})  # gains in form mostly
    other = write_run(tmp_path, "other", rows, planned=10, evals={0: 0.2, 10: 0.5})
    _with_forms(other, {0: (0.3, 0.5), 10: (0.6, 0.7)})  # gains in substance
    console = recording_console()
    out = tmp_path / "cmp"
    assert compare_runs([base, other], out=out, console=console) == 0
    text = console_text(console)
    answered = next(line for line in text.splitlines() if "held-out answered" in line)
    assert "30.0% → 90.0%" in answered and "30.0% → 60.0%" in answered and "-30.0 pts" in answered
    any_form = next(line for line in text.splitlines() if "held-out acc any form" in line)
    assert "50.0% → 55.0%" in any_form and "50.0% → 70.0%" in any_form and "+15.0 pts" in any_form
    assert "ran clean" not in text  # no run measured it
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["name"]: r for r in summary["runs"]}
    assert runs["base"]["heldout_answered_last"] == 0.9
    assert runs["other"]["heldout_accuracy_any_form_first"] == 0.5
    assert runs["other"]["delta_vs_baseline"]["heldout_accuracy_any_form_last"] == pytest.approx(
        0.15
    )
    assert {"heldout_answered.png", "heldout_accuracy_any_form.png"} <= set(summary["plots"])
    assert "heldout_ran_clean.png" not in summary["plots"]
