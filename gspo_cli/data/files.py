"""Data rows from local files (JSON, JSONL, Parquet; a file or a folder) or the hub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.core.errors import GspoError

Row = dict[str, Any]
DATA_SUFFIXES = (".json", ".jsonl", ".parquet")


# ----------------------------------------------------------------------------- local files


def data_files(path: Path) -> list[Path]:
    """The data files at `path`: the file itself, or a folder's *.json/*.jsonl/*.parquet, sorted."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
        if not files:
            raise GspoError(f"{path}: no {', '.join(DATA_SUFFIXES)} files in this folder")
        return files
    raise GspoError(f"{path}: no such file or folder")


def _jsonl_rows(path: Path) -> Iterator[Row]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GspoError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise GspoError(f"{path}:{lineno}: expected a JSON object per line")
            yield row


def _json_rows(path: Path) -> list[Row]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise GspoError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise GspoError(f"{path}: expected a JSON list of objects (or use .jsonl)")
    return data


def _parquet_rows(path: Path) -> list[Row]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # comes with `datasets`

    try:
        rows: list[Row] = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise GspoError(f"{path}: cannot read Parquet ({type(exc).__name__})") from exc
    return rows


def read_file_rows(path: Path) -> list[Row]:
    """Rows of one data file, chosen by suffix (.json list, .jsonl lines, .parquet table)."""
    if path.suffix == ".jsonl":
        return list(_jsonl_rows(path))
    if path.suffix == ".json":
        return _json_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise GspoError(f"{path}: unknown data format; use {', '.join(DATA_SUFFIXES)}")


# ----------------------------------------------------------------------------- the hub


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hugging Face hub, as `datasets.load_dataset` arguments.

    `shown` is the id used in messages (for a "json" loader over hf:// files, the repo id).
    """

    path: str
    split: str
    name: str | None = None
    data_files: tuple[str, ...] | None = None
    shown: str | None = None

    @property
    def label(self) -> str:
        return self.shown or self.path


def load_hub_rows(source: HubSource) -> list[Row]:
    """Rows of a hub data set; a failure (offline, missing, gated) is a one-line GspoError."""
    try:
        import datasets

        files = list(source.data_files) if source.data_files else None
        ds = datasets.load_dataset(source.path, source.name, split=source.split, data_files=files)
        rows: list[Row] = [dict(r) for r in ds]
    except Exception as exc:  # anything from the network or the hub means "use local data"
        raise GspoError(
            f"cannot load {source.label!r} from the hub (offline?) [{type(exc).__name__}]; "
            "pass a local file with --data PATH"
        ) from exc
    return rows
