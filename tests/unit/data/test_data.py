from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.data import arithmetic_split, load_rows
from gspo_cli.recipe import Recipe
from gspo_cli.recipe.inputs import ArithmeticTaskConfig, DataConfig


def test_local_jsonl_with_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"q": f"Q{i}", "a": str(i), "extra": i}) + "\n" for i in range(3))
    )
    data = Recipe.model_validate(
        {"data": {"source": str(path), "prompt_column": "q", "answer_column": "a"}}
    ).data
    rows = load_rows(data.source, "train", data)
    assert [(r["prompt"], r["answer"], r["extra"]) for r in rows] == [
        ("Q0", "0", 0),
        ("Q1", "1", 1),
        ("Q2", "2", 2),
    ]


def test_missing_column_names_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "x", "answer": "1"}) + "\n")
    data = Recipe.model_validate({"data": {"source": str(path)}}).data
    with pytest.raises(GspoError, match=r"data\.prompt_column"):
        load_rows(data.source, "train", data)


def test_arithmetic_is_seeded_held_out_and_solutions_are_right() -> None:
    cfg = ArithmeticTaskConfig(num_train=300, num_eval=50, max_operand=9, operators="+-*")
    train, test = arithmetic_split(cfg, "train", 1), arithmetic_split(cfg, "test", 1)
    assert train == arithmetic_split(cfg, "train", 1)
    assert not {p["prompt"] for p in test} & {p["prompt"] for p in train}
    for p in train + test:
        expression = p["prompt"].removeprefix("Compute ").removesuffix(".")
        assert eval(expression) == int(p["answer"])
        assert p["solution"].endswith(f"\\boxed{{{p['answer']}}}")


def test_noisy_cold_start_knobs() -> None:
    cfg = ArithmeticTaskConfig(num_train=2000, unboxed_rate=0.5, slip_rate=0.3)
    rows = arithmetic_split(cfg, "train", 3)
    unboxed = sum("Answer:" in r["solution"] for r in rows) / len(rows)
    slipped = sum(
        r["solution"].split()[-1].removeprefix("\\boxed{").removesuffix("}") != r["answer"]
        for r in rows
    ) / len(rows)
    assert 0.45 < unboxed < 0.55 and 0.25 < slipped < 0.35


def test_data_package_imports_neither_eval_train_nor_torch() -> None:
    """Benchmarks are data: `data/` sits below `eval/` and `train/` and needs no torch."""
    code = (
        "import sys, gspo_cli.data, gspo_cli.recipe.schema; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
        "or m.startswith(('gspo_cli.eval', 'gspo_cli.train'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_empty_data_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(GspoError, match="no rows"):
        load_rows(str(path), "train", DataConfig(source=str(path)))
