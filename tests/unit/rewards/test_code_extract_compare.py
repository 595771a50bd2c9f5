"""Code reward, pure parts: program extraction, output comparison, test-format parsing."""

from __future__ import annotations

import base64
import json
import pickle
import tracemalloc
import zlib
from pathlib import Path

import pytest

from gspo_cli.rewards.code import (
    TestFormatError,
    compare_json,
    compare_stdout,
    extract_code,
    parse_tests,
)
from gspo_cli.rewards.code.compare import numbers_close

LCB = "benchmarks/livecodebench/sandboxfusion_lcb_v1_sample"


# --- extraction ---------------------------------------------------------------------------


def test_last_python_block_wins() -> None:
    text = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\n"
    assert extract_code(text) == "print(2)"


def test_python_tag_preferred_over_later_untagged_block() -> None:
    text = "```python\nprint('code')\n```\nSample output:\n```\n42\n```"
    assert extract_code(text) == "print('code')"


def test_untagged_block_used_when_no_python_tag() -> None:
    assert extract_code("Here:\n```\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)"


def test_other_languages_and_unclosed_blocks_are_not_code() -> None:
    assert extract_code("```cpp\nint main(){}\n```") is None
    assert extract_code("```python\nprint(1)\n") is None  # truncated generation
    assert extract_code("no code at all") is None
    assert extract_code("```python\n\n```") is None


def test_tag_variants_and_indented_fences() -> None:
    assert extract_code("```Python3\nprint(3)\n```") == "print(3)"
    assert extract_code("  ```py\n  print(4)\n  ```") == "  print(4)"


# --- stdout comparison (LiveCodeBench rules) -------------------------------------------------


@pytest.mark.parametrize(
    ("got", "want"),
    [
        ("YES\nNO\n", "YES\nNO"),
        ("  YES  \r\nNO\n\n\n", "YES\nNO\n"),
        ("1 2 3", "1  2\t3"),
        ("0.3333333", "0.333333333"),
        ("1e3", "1000.0"),
        ("007", "7"),
        ("-0", "0"),
        ("0.5000000001", "0.5"),
    ],
)
def test_outputs_that_match(got: str, want: str) -> None:
    assert compare_stdout(got, want)


@pytest.mark.parametrize(
    ("got", "want"),
    [
        ("YES", "NO"),
        ("yes", "YES"),  # case matters, as in LiveCodeBench
        ("1 2", "1 2 3"),
        ("1\n2", "1 2"),
        ("0.3334", "0.3333"),
        ("1000000000000000001", "1000000000000000000"),  # integers never get a tolerance
        ("998244000.0", "998244353"),  # a float within 1e-6 of an expected integer: wrong
        ("998244353.0", "998244353"),  # an expected integer needs an integer token
        ("-0.0", "0"),
        ("1e3", "1000"),
        ("nan", "NaN"),
        ("inf", "inf0"),
        ("", "0"),
    ],
)
def test_outputs_that_differ(got: str, want: str) -> None:
    assert not compare_stdout(got, want)


def test_a_flood_of_lines_or_tokens_is_compared_without_splitting_it() -> None:
    flood = "1\n" * 2_800_000
    wide, other = "1 " * 2_800_000, flood.replace("1", "2", 1)
    tracemalloc.start()
    try:
        assert not compare_stdout(flood, "1\n")  # the line counts differ
        assert not compare_stdout(wide, "1 1")  # one line, far too many tokens
        assert not compare_stdout(flood, other)  # as many lines, the first differs
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # At most the two stripped copies; a list of 2.8M line strings alone would be ~50x that.
    assert peak < 2.5 * len(flood)


def test_numbers_close_rejects_non_numbers_and_huge_tokens() -> None:
    assert not numbers_close("1_000", "1000")
    assert not numbers_close("1" * 5000, "1" * 5000 + "0")
    assert numbers_close("1e-9", "0.0")


def test_json_results() -> None:
    assert compare_json("[1, 2]", "[1,2]")
    assert compare_json("2", "2.0")
    assert not compare_json("[2, 1]", "[1, 2]")
    assert not compare_json('"a"', '"b"')
    assert compare_json("not json", "not json")


# --- test formats ------------------------------------------------------------------------------


def test_livecodebench_decoded_rows(shared: Path) -> None:
    rows = [json.loads(x) for x in (shared / f"{LCB}.decoded.jsonl").read_text().splitlines()]
    by_id = {r["task_id"]: r for r in rows}
    stdio = parse_tests({k: by_id["codeforces/1873_A"][k] for k in ("inputs", "outputs")})
    assert len(stdio) == 5 and stdio[1].kind == "stdio" and stdio[1].output == "YES\n"
    row = by_id["leetcode/2727"]
    call = parse_tests(json.dumps({"inputs": row["inputs"], "outputs": row["outputs"],
                                   "fn_name": row["fn_name"]}))  # fmt: skip
    assert len(call) == 14 and call[0].kind == "call" and call[0].fn_name == "countSeniors"


def test_livecodebench_compressed_private_tests(shared: Path) -> None:
    raw = json.loads((shared / f"{LCB}.jsonl").read_text().splitlines()[0])["test"]
    cases = parse_tests(raw)  # base64 -> zlib -> pickle -> {"input_output": json}
    assert len(cases) == 5 and cases[0].input.startswith("6\nabc")


def test_hub_encoding_round_trip() -> None:
    io_json = json.dumps({"inputs": ["1\n"], "outputs": ["2\n"], "fn_name": ""})
    blob = base64.b64encode(zlib.compress(pickle.dumps(io_json))).decode()
    (case,) = parse_tests(blob)
    assert (case.kind, case.input, case.output) == ("stdio", "1\n", "2\n")


def test_pickled_objects_are_refused() -> None:
    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/etc/passwd")))).decode()
    with pytest.raises(TestFormatError, match=r"refusing to load pathlib\.PosixPath"):
        parse_tests(evil)


def test_code_contests_rows(shared: Path) -> None:
    path = shared / "benchmarks/codeforces/sandboxfusion_code_contests_sample.jsonl"
    row = json.loads(path.read_text().splitlines()[3])
    cases = parse_tests(row["test"])  # a JSON string of [{"input": {"stdin"}, ...}]
    assert len(cases) > 50
    assert cases[0].input == "1\nXXXS\nXXXL\n" and cases[0].output == "1\n"
    column_form = parse_tests({"input": ["1\n", "2\n"], "output": ["a", "b"]})
    assert [c.output for c in column_form] == ["a", "b"]


def test_assert_style_tests(shared: Path) -> None:
    rows = json.loads((shared / "benchmarks/code_extra/rllm_leetcode_test.json").read_text())
    (case,) = parse_tests(rows[0]["tests"])
    assert case.kind == "assert" and "check(Solution().minOperations)" in (case.check or "")
    listed = parse_tests(["assert f(1) == 2", "assert f(2) == 3"])
    assert [c.check for c in listed] == ["assert f(1) == 2", "assert f(2) == 3"]


@pytest.mark.parametrize("bad", [42, {"foo": 1}, "%%% not tests %%%", [1, 2]])
def test_unknown_formats_raise(bad: object) -> None:
    with pytest.raises(TestFormatError):
        parse_tests(bad)


def test_mismatched_columns_raise() -> None:
    with pytest.raises(TestFormatError):
        parse_tests({"inputs": ["1"], "outputs": []})
