"""What `gspo eval` tells and leaves: progress on stderr, where the results are, files a plain
open would make (0644), and a model's own task asked in its training recipe's words."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.data import render_prompt
from gspo_cli.data.benchmarks import MATH_INSTRUCTION, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.eval.runner import EngineFactory, EvalSettings, prompt_builder, run_eval
from gspo_cli.runs.folder import RUN_MARKER
from tests.support.fixed_engine import FixedRolloutEngine
from tests.support.helpers import REPO, invoke_cli, write_recipe

TEMPLATE = "Q: {prompt}\nEnd with \\boxed{{}}."
QUESTIONS = [("Compute 1+2.", "3"), ("Compute 4-1.", "3"), ("Compute 2*3.", "6")]


def _problems(tmp_path: Path) -> Path:
    data = tmp_path / "problems.jsonl"
    rows = [{"id": f"p{i}", "question": q, "answer": a} for i, (q, a) in enumerate(QUESTIONS)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


@pytest.fixture(scope="module")
def evaluated(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, str, subprocess.CompletedProcess[str]]:
    """One real `gspo eval --recipe` of custom data, in a subprocess (not a terminal), umask 022."""
    folder = tmp_path_factory.mktemp("feedback")
    recipe = write_recipe(folder, {"data": {"prompt_template": TEMPLATE}})
    out = folder / "ev"
    args = ["eval", "builtin:tiny-dense", "--benchmark", "custom", "--data", str(_problems(folder))]
    args += ["--recipe", str(recipe), "--samples", "1", "--max-new-tokens", "4", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "gspo_cli.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=lambda: os.umask(0o022),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, recipe.read_text(), result


def test_progress_goes_to_stderr(
    evaluated: tuple[Path, str, subprocess.CompletedProcess[str]],
) -> None:
    _, _, result = evaluated
    lines = [x for x in result.stderr.splitlines() if x.startswith("eval ")]
    assert lines[0].startswith("eval 1/3 problems, ") and "eta " in lines[0], result.stderr
    assert lines[-1].startswith("eval 3/3 problems, "), result.stderr
    assert "eval " not in result.stdout


def test_it_ends_saying_where_the_results_are(
    evaluated: tuple[Path, str, subprocess.CompletedProcess[str]],
) -> None:
    out, _, result = evaluated
    last = result.stdout.strip().splitlines()[-1]
    assert last == f"results: {out / 'results.json'} (per problem: {out / 'samples.jsonl'})"


def test_outputs_get_the_usual_mode(
    evaluated: tuple[Path, str, subprocess.CompletedProcess[str]],
) -> None:
    out, _, _ = evaluated
    for name in ("results.json", "settings.json", "samples.jsonl", RUN_MARKER):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name
    assert sorted(p.name for p in out.iterdir()) == [
        RUN_MARKER,
        "results.json",
        "samples.jsonl",
        "settings.json",
    ]


def test_recipe_template_is_recorded_and_no_deepspeed_warning(
    evaluated: tuple[Path, str, subprocess.CompletedProcess[str]],
) -> None:
    out, _, result = evaluated
    results = json.loads((out / "results.json").read_text())
    assert results["prompt_template"] == TEMPLATE
    assert json.loads((out / "settings.json").read_text())["prompt_template"] == TEMPLATE
    assert "Setting accelerator" not in result.stdout + result.stderr


def _answering(problems: list[Problem]) -> EngineFactory:
    """An engine that answers each problem right when it is asked in TEMPLATE's words; any
    other prompt is a KeyError naming it."""

    def build(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> FixedRolloutEngine:
        asked = {
            tuple(render_prompt(tokenizer, TEMPLATE.format(prompt=p.question))): [
                f"\\boxed{{{p.answer}}}"
            ]
            for p in problems
        }
        return FixedRolloutEngine(tokenizer, asked)

    return build


def test_custom_problems_are_asked_with_the_recipe_template(tmp_path: Path) -> None:
    data = _problems(tmp_path)
    problems = load_benchmark("custom", str(data))
    assert MATH_INSTRUCTION in prompt_builder(None)(problems[0])  # the default: maths wording
    settings = EvalSettings(
        "builtin:tiny-dense", "custom", samples=1, data=str(data), prompt_template=TEMPLATE
    )
    console = Console(file=io.StringIO(), width=200)
    results = run_eval(
        settings, tmp_path / "ev", console=console, engine_factory=_answering(problems)
    )
    assert results["metrics"]["avg@1"]["value"] == 1.0  # every prompt was the template's


def test_a_bad_prompt_template_is_one_line(tmp_path: Path) -> None:
    data = _problems(tmp_path)
    args = ["builtin:tiny-dense", "--benchmark", "custom", "--data", str(data)]
    result = invoke_cli("eval", *args, "--prompt-template", "{question}", "--out", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --prompt-template: unknown field {question}: the only field is {prompt}; write "
        "a literal brace as {{ or }}"
    ]
