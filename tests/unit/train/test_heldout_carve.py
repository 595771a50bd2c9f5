"""Held-out accuracy is never measured on training rows: sources without splits (a local file,
benchmark:) have their held-out rows carved out of training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.data import load_rows
from gspo_cli.models.builtin import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.train.run.problem_sets import (
    carves_heldout,
    heldout_note,
    heldout_problems,
    heldout_rows,
    load_problems,
    training_rows,
)

GSM8K = Path("benchmarks") / "gsm8k" / "qwen25math_gsm8k_test.jsonl"


def _file(tmp_path: Path, n: int = 60, repeats: int = 3) -> Path:
    """n rows, the first `repeats` prompts asked twice (a file may repeat a question)."""
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    rows += rows[:repeats]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _recipe(**data: object) -> Recipe:
    return Recipe.model_validate(
        {"data": {"prompt_column": "question", **data}, "eval": {"num_problems": 20}}
    )


def test_a_local_file_gets_a_seeded_heldout_slice_that_is_never_trained_on(
    tmp_path: Path,
) -> None:
    recipe = _recipe(source=str(_file(tmp_path)))
    assert carves_heldout(recipe)
    train, held = training_rows(recipe), heldout_rows(recipe)
    held_prompts = {r["prompt"] for r in held}
    assert len(held) == 20 and len(held_prompts) == 20
    assert not held_prompts & {r["prompt"] for r in train}
    everything = load_rows(recipe.data.source, "train", recipe.data)
    assert train == [r for r in everything if r["prompt"] not in held_prompts]  # only those go
    assert (train, held) == (training_rows(recipe), heldout_rows(recipe))  # deterministic
    other = heldout_rows(_recipe(source=str(_file(tmp_path)), seed=7))
    assert {r["prompt"] for r in other} != {r["prompt"] for r in held}  # data.seed chooses


def test_no_eval_problem_is_a_training_prompt(tmp_path: Path) -> None:
    recipe = _recipe(source=str(_file(tmp_path)), heldout_size=10, prompt_template="{prompt}")
    _, tokenizer = create_builtin("tiny-dense", 0)
    train = load_problems(recipe, tokenizer, "train")
    problems = heldout_problems(recipe, tokenizer)
    assert len(problems) == 10
    assert not {p.question for p in problems} & {str(r["prompt"]) for r in train.rows}
    note = heldout_note(recipe, train)
    assert note is not None and note.startswith("held-out: 10 prompts of ")
    assert note.endswith(f"; {len(train.rows)} training rows")


def test_the_same_file_named_as_eval_source_is_carved_too(tmp_path: Path) -> None:
    path = str(_file(tmp_path))
    assert carves_heldout(_recipe(source=path, eval_source=path))
    other = tmp_path / "eval.jsonl"
    other.write_text(_file(tmp_path).read_text())
    assert not carves_heldout(_recipe(source=path, eval_source=str(other)))


def test_a_benchmark_source_is_carved(shared: Path) -> None:
    recipe = _recipe(source=f"benchmark:gsm8k:{shared / GSM8K}", prompt_column="prompt")
    held = {r["prompt"] for r in heldout_rows(recipe)}
    assert len(held) == 20 and not held & {r["prompt"] for r in training_rows(recipe)}


def test_sources_with_their_own_held_out_split_are_not_carved() -> None:
    assert not carves_heldout(Recipe())  # builtin:arithmetic has train and test splits
    hub = Recipe.model_validate({"data": {"source": "someone/some-dataset"}})
    assert not carves_heldout(hub)  # a hub dataset's eval_split (test)


def test_too_few_rows_to_carve_is_one_clear_error(tmp_path: Path) -> None:
    recipe = _recipe(source=str(_file(tmp_path, n=30, repeats=0)))  # 20 of 30 held out
    with pytest.raises(GspoError, match=r"has 30 distinct prompts; holding out 20") as exc:
        training_rows(recipe)
    assert "\n" not in str(exc.value)
