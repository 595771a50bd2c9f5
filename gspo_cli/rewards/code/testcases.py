"""Normalise the test formats data sets use into one list of TestCase.

Accepted: LiveCodeBench `input_output` ({"inputs", "outputs", "fn_name"}, possibly wrapped in
{"input_output": "<json>"}), its hub encoding base64 -> zlib -> pickle -> JSON, CodeContests /
SandboxFusion lists ([{"input": {"stdin"}, "output": {"stdout"}}] or plain strings), the
column form {"input": [...], "output": [...]}, assert checks ({"functional": "def check..."},
a list of assert statements, or {"asserts": [...]}), and any of these as a JSON string.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["stdio", "call", "assert"]


class TestFormatError(ValueError):
    """The tests are in no format we know."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class TestCase:
    """One test: stdin -> expected stdout, JSON args -> JSON result, or assert statements."""

    __test__ = False  # not a pytest class

    kind: Kind
    input: str = ""
    output: str = ""
    fn_name: str | None = None
    check: str | None = None


class _DataOnlyUnpickler(pickle.Unpickler):
    """Hub tests are pickled; refusing every class keeps unpickling from running code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def _decode_text(text: str) -> Any:
    """JSON, or LiveCodeBench's base64(zlib(pickle)) private-test encoding, or assert code."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, zlib.error, ValueError):
        if "assert" in text:
            return {"functional": text}
        raise TestFormatError("tests are neither JSON nor base64/zlib data") from None
    if raw[:1] == b"\x80":  # pickle protocol marker
        return _DataOnlyUnpickler(io.BytesIO(raw)).load()
    return json.loads(raw)


def _text(value: Any, key: str) -> str:
    """A test's stdin/stdout, whether a string or {"stdin": ...}/{"stdout": ...}."""
    if isinstance(value, dict):
        value = value.get(key, "")
    if isinstance(value, list):  # some sets store lines
        value = "\n".join(map(str, value))
    return "" if value is None else str(value)


def _from_columns(inputs: list[Any], outputs: list[Any], fn_name: Any) -> list[TestCase]:
    if len(inputs) != len(outputs):
        raise TestFormatError(f"{len(inputs)} inputs but {len(outputs)} outputs")
    name = str(fn_name) if fn_name else None
    kind: Kind = "call" if name else "stdio"
    return [
        TestCase(kind, _text(i, "stdin"), _text(o, "stdout"), fn_name=name)
        for i, o in zip(inputs, outputs, strict=True)
    ]


def _from_dict(tests: dict[str, Any]) -> list[TestCase]:
    if "input_output" in tests:
        return parse_tests(tests["input_output"])
    if "inputs" in tests and "outputs" in tests:
        return _from_columns(tests["inputs"], tests["outputs"], tests.get("fn_name"))
    if isinstance(tests.get("input"), list) and isinstance(tests.get("output"), list):
        return _from_columns(tests["input"], tests["output"], tests.get("fn_name"))
    if "input" in tests and "output" in tests:
        return [TestCase("stdio", _text(tests["input"], "stdin"), _text(tests["output"], "stdout"))]
    if isinstance(tests.get("functional"), str):
        return [TestCase("assert", check=tests["functional"])]
    if isinstance(tests.get("asserts"), list):
        return _from_list(tests["asserts"])
    raise TestFormatError(f"unknown test dict with keys {sorted(tests)[:8]}")


def _from_list(tests: list[Any]) -> list[TestCase]:
    if all(isinstance(t, str) for t in tests):
        return [TestCase("assert", check=t) for t in tests]
    cases: list[TestCase] = []
    for test in tests:
        if not isinstance(test, dict):
            raise TestFormatError(f"unknown test entry of type {type(test).__name__}")
        cases += _from_dict(test)
    return cases


def parse_tests(tests: Any) -> list[TestCase]:
    """Every test in `tests`, in order. Raises TestFormatError for unknown formats."""
    if isinstance(tests, bytes):
        tests = tests.decode("utf-8")
    if isinstance(tests, str):
        tests = _decode_text(tests)
        if isinstance(tests, str):  # JSON that held JSON (e.g. a pickled input_output string)
            tests = _decode_text(tests)
    if isinstance(tests, dict):
        return _from_dict(tests)
    if isinstance(tests, list):
        return _from_list(tests)
    raise TestFormatError(f"tests of type {type(tests).__name__} are not supported")
