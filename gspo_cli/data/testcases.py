"""Code test cases: every test format the data sets use, parsed once into a list of TestCase.

Accepted: LiveCodeBench `input_output` ({"inputs", "outputs", "fn_name"}, possibly wrapped in
{"input_output": "<json>"}), its hub encoding base64 -> zlib -> pickle -> JSON, CodeContests /
SandboxFusion lists ([{"input": {"stdin"}, "output": {"stdout"}}] or plain strings), the
column form {"input": [...], "output": [...]}, assert checks ({"functional": "def check..."},
a list of assert statements, or {"asserts": [...]}), any of these as a JSON string, and an
already parsed sequence of TestCase.

One unpickling policy: hub tests are pickled, and only plain builtin containers are resolved,
so unpickling test data can never run code.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
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


class _PlainDataUnpickler(pickle.Unpickler):
    """Resolves a few builtin containers and nothing else: no class, no callable."""

    ALLOWED = frozenset({"set", "frozenset", "list", "dict", "tuple"})

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in self.ALLOWED:
            return super().find_class(module, name)
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
    try:
        obj = _PlainDataUnpickler(io.BytesIO(raw)).load() if raw[:1] == b"\x80" else raw
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise TestFormatError(f"compressed test data does not unpickle ({exc})") from None
    if isinstance(obj, bytes):
        obj = obj.decode("utf-8")
    return json.loads(obj) if isinstance(obj, str) else obj


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


def _from_list(tests: Sequence[Any]) -> list[TestCase]:
    if all(isinstance(t, TestCase) for t in tests):
        return list(tests)
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
    if isinstance(tests, list | tuple):
        return _from_list(tests)
    raise TestFormatError(f"tests of type {type(tests).__name__} are not supported")


def merge_tests(*parts: Sequence[TestCase], fn_name: str | None = None) -> tuple[TestCase, ...]:
    """Concatenate test sets (e.g. public + private); `fn_name` makes input/output tests
    call-based (LiveCodeBench keeps the function name in the row's metadata)."""
    cases = [case for part in parts for case in part]
    names = {c.fn_name for c in cases if c.fn_name}
    if fn_name is None and len(names) > 1:
        raise TestFormatError(f"test sets disagree on fn_name: {sorted(names)}")
    if fn_name:
        cases = [
            c if c.kind == "assert" else replace(c, kind="call", fn_name=fn_name) for c in cases
        ]
    return tuple(cases)
