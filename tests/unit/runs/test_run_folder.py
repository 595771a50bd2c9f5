"""The run-folder contract: JSONL append/read, atomic writes, and one spelling of each name."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import gspo_cli
from gspo_cli.runs import folder as run_folder
from gspo_cli.runs.folder import (
    append_jsonl,
    iter_jsonl,
    read_jsonl,
    write_bytes_atomic,
    write_text_atomic,
)

PACKAGE = Path(gspo_cli.__file__).parent
# Plain words that are also used for other things (the `comparisons/latest` default, the
# "eval" statistics key): the scan would flag those uses, so it leaves them out.
COMMON_WORDS = {run_folder.LATEST, run_folder.EVAL_DIR}


def test_append_then_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / run_folder.METRICS
    records = [{"step": 1, "loss": 0.5, "text": "é"}, {"step": 2, "loss": "nan"}]
    for record in records:
        append_jsonl(path, record)
    assert read_jsonl(path) == records
    assert path.read_text(encoding="utf-8").count("\n") == 2


def test_append_refuses_non_finite_numbers(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        append_jsonl(tmp_path / "x.jsonl", {"loss": float("nan")})


def test_torn_last_line_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / run_folder.SAMPLES
    append_jsonl(path, {"id": "a"})
    with path.open("a", encoding="utf-8") as f:
        f.write('\n  \n[1, 2]\n{"id": "b", "compl')  # blank lines, a non-object, a torn line
    assert read_jsonl(path) == [{"id": "a"}]
    assert [n for n, obj in iter_jsonl(path) if obj is None] == [4, 5]


def test_read_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_atomic_text_write_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / run_folder.SUMMARY
    path.write_text("old", encoding="utf-8")
    write_text_atomic(path, json.dumps({"steps": 3}))
    assert json.loads(path.read_text(encoding="utf-8")) == {"steps": 3}
    assert [p.name for p in tmp_path.iterdir()] == [run_folder.SUMMARY]


def test_atomic_bytes_write(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    write_bytes_atomic(path, b"\x89PNG\x00\xff")
    write_bytes_atomic(path, b"\x89PNG\x01")
    assert path.read_bytes() == b"\x89PNG\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / run_folder.RESULTS
    path.write_text("old", encoding="utf-8")
    with pytest.raises(TypeError):
        write_bytes_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == [run_folder.RESULTS]


def test_step_folders_sort_in_step_order() -> None:
    names = [run_folder.step_folder(s) for s in (9, 10, 100_000)]
    assert names == sorted(names) == ["step_000009", "step_000010", "step_100000"]
    assert Path(names[0]).match(run_folder.STEP_GLOB)


def _layout_names() -> set[str]:
    names = {
        value for key, value in vars(run_folder).items() if key.isupper() and isinstance(value, str)
    }
    return names - COMMON_WORDS


def test_layout_names_are_spelled_only_in_run_folder() -> None:
    """Every layout name is a run_folder constant: a second spelling would let them drift."""
    names = _layout_names()
    assert {"metrics.jsonl", "checkpoints", "trainer_state.pt", "results.json"} <= names
    found = []
    for source in sorted(PACKAGE.rglob("*.py")):
        if source == PACKAGE / "runs" / "folder.py":
            continue
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{source.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert found == [], "use gspo_cli.runs.folder's constants instead:\n" + "\n".join(found)


def test_an_append_after_a_torn_line_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", "comp')  # a kill mid-append
    append_jsonl(path, {"id": "b"})
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b"]
