"""Benchmark rows from local files (JSON, JSONL, Parquet; a file or a folder) or the hub.

Also the test-case decoding shared by the code benchmarks: LiveCodeBench's compressed private
tests (base64 -> zlib -> pickle -> JSON, unpickled with a plain-data-only Unpickler) and the
various test-list shapes, all normalised to the LiveCodeBench `input_output` dict.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from gspo_cli.errors import GspoError

Row = dict[str, Any]
DATA_SUFFIXES = (".json", ".jsonl", ".parquet")


class CodeTests(TypedDict):
    """LiveCodeBench `input_output` form. `fn_name` None means stdin/stdout tests."""

    inputs: list[str]
    outputs: list[str]
    fn_name: str | None


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


# ----------------------------------------------------------------------------- test cases


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles plain data only: no class other than a few builtin containers is resolved."""

    ALLOWED = frozenset({"set", "frozenset", "list", "dict", "tuple"})

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: plain data only")


def decode_compressed(text: str) -> Any:
    """base64 -> zlib -> (restricted) pickle -> JSON, as LiveCodeBench ships private tests."""
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
        obj = _PlainDataUnpickler(io.BytesIO(raw)).load()
    except (binascii.Error, zlib.error, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(f"not JSON and not base64/zlib/pickle test data ({exc})") from None
    if isinstance(obj, bytes):
        obj = obj.decode("utf-8")
    return json.loads(obj) if isinstance(obj, str) else obj


def decode_test_field(value: Any) -> Any:
    """A test field as data: JSON text is parsed, compressed text decoded, data returned as is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return decode_compressed(value)


def _io_text(value: Any, key: str) -> str:
    """A test input/output: a string, or CodeContests' {"stdin": ...} / {"stdout": ...}."""
    if isinstance(value, Mapping) and key in value:
        value = value[key]
    if not isinstance(value, str):
        raise ValueError(f"expected a string test {key}, got {type(value).__name__}")
    return value


def _tests_from_mapping(data: Mapping[str, Any]) -> CodeTests:
    if "input_output" in data:
        return parse_tests(data["input_output"])
    if "inputs" in data and "outputs" in data:
        inputs, outputs = list(data["inputs"]), list(data["outputs"])
    elif "input" in data and "output" in data:  # deepmind/code_contests {"input": [...], ...}
        inputs, outputs = list(data["input"]), list(data["output"])
    else:
        raise ValueError(f"unknown test format with keys {sorted(data)}")
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} test inputs but {len(outputs)} outputs")
    return CodeTests(
        inputs=[_io_text(x, "stdin") for x in inputs],
        outputs=[_io_text(y, "stdout") for y in outputs],
        fn_name=data.get("fn_name") or None,
    )


def parse_tests(value: Any) -> CodeTests:
    """Normalise any supported test field to {"inputs", "outputs", "fn_name"}.

    Accepts: the LCB dict (or {"input_output": <json>}), JSON or compressed text of any of
    these, or a list of {"input", "output"} cases whose values may be strings or CodeContests'
    {"stdin"} / {"stdout"} objects. Raises ValueError for anything else.
    """
    data = decode_test_field(value)
    if isinstance(data, Mapping):
        return _tests_from_mapping(data)
    if isinstance(data, list):
        if not all(isinstance(t, Mapping) and "input" in t and "output" in t for t in data):
            raise ValueError("a test list must hold {'input': ..., 'output': ...} objects")
        return CodeTests(
            inputs=[_io_text(t["input"], "stdin") for t in data],
            outputs=[_io_text(t["output"], "stdout") for t in data],
            fn_name=None,
        )
    raise ValueError(f"unknown test format: {type(data).__name__}")


def merge_tests(*parts: CodeTests, fn_name: str | None = None) -> CodeTests:
    """Concatenate test sets (e.g. public + private); `fn_name` overrides theirs when given."""
    names = {p["fn_name"] for p in parts if p["fn_name"]}
    if len(names) > 1:
        raise ValueError(f"test sets disagree on fn_name: {sorted(names)}")
    return CodeTests(
        inputs=[x for p in parts for x in p["inputs"]],
        outputs=[y for p in parts for y in p["outputs"]],
        fn_name=fn_name or (names.pop() if names else None),
    )
