import base64
import collections
import json
import os
import pickle
import subprocess
import sys
import zlib
from datetime import date
from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.core.registry import UnknownNameError
from gspo_cli.data.benchmarks import (
    BENCHMARKS,
    BENCHMARKS_DIR_ENV,
    MATH_INSTRUCTION,
    build_prompt,
    load_benchmark,
)
from gspo_cli.data.testcases import TestCase, parse_tests

EXPECTED_COUNTS = {
    "aime24": 30,
    "aime25": 30,
    "math500": 500,
    "gsm8k": 1319,
    "livecodebench": 3,
    "codeforces": 428,  # the folder: 20 CodeContests + 408 CodeElo
}
AIME25_ANSWERS = [70, 588, 16, 117, 279, 504, 821, 77, 62, 81, 259, 510, 204, 60, 735]
AIME25_ANSWERS += [468, 49, 82, 106, 336, 293, 237, 610, 149, 907, 113, 19, 248, 104, 240]


@pytest.fixture
def bench(shared: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = shared / "benchmarks"
    monkeypatch.setenv(BENCHMARKS_DIR_ENV, str(root))
    return root


def _compress(obj: object) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(obj))).decode()


def test_every_builtin_is_covered() -> None:
    assert set(BENCHMARKS.names()) == {*EXPECTED_COUNTS, "custom"}


@pytest.mark.parametrize(("name", "count"), sorted(EXPECTED_COUNTS.items()))
def test_builtin_loads_its_default_file(bench: Path, name: str, count: int) -> None:
    problems = load_benchmark(name)
    assert len(problems) == count
    assert len({p.id for p in problems}) == count
    kind = BENCHMARKS.get(name).kind
    for p in problems:
        assert p.kind == kind and p.benchmark == name and p.question.strip()
        if kind == "math":
            assert p.answer and p.tests is None
            assert build_prompt(p) == f"{p.question}\n{MATH_INSTRUCTION}"
        else:
            assert p.answer is None and p.tests is not None
            assert p.tests and all(t.kind in ("stdio", "call") for t in p.tests)
            assert all(isinstance(t.input, str) and isinstance(t.output, str) for t in p.tests)
            assert "### Question:" in build_prompt(p)


def test_aime_answers_are_integers_in_both_copies(bench: Path) -> None:
    qwen = load_benchmark("aime24")
    deepscaler = load_benchmark("aime24", bench / "aime24" / "deepscaler_aime24_test.json")
    assert {p.id: p.answer for p in qwen} == {p.id: p.answer for p in deepscaler}
    by_id = {p.id: p.answer for p in qwen}
    assert by_id["2024-I-1"] == "204"
    assert by_id["2024-I-2"] == "25"  # "025" in the files
    assert by_id["2024-I-15"] == "721"  # numbered 0 in the deepscaler copy
    assert all(a is not None and a == str(int(a)) and int(a) < 1000 for a in by_id.values())
    assert [p.answer for p in load_benchmark("aime25")] == [str(a) for a in AIME25_ANSWERS]


def test_gsm8k_answers_after_hashes(bench: Path) -> None:
    problems = load_benchmark("gsm8k")
    assert problems[0].answer == "18"
    assert problems[0].metadata["solution"].endswith("every day at the farmer’s market.")
    for p in problems:
        assert p.answer is not None and "," not in p.answer
        float(p.answer)
    assert "2125" in {p.answer for p in problems}  # "2,125" in the file


def test_math500_fields(bench: Path) -> None:
    problems = load_benchmark("math500")
    assert problems[0].id == "test/precalculus/807.json"
    assert problems[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert {p.difficulty for p in problems} == {"1", "2", "3", "4", "5"}
    assert problems[0].metadata["subject"] == "precalculus"


def test_livecodebench_compressed_tests_match_decoded_copy(bench: Path) -> None:
    folder = bench / "livecodebench"
    packed = load_benchmark("livecodebench")
    decoded = load_benchmark("livecodebench", folder / "sandboxfusion_lcb_v1_sample.decoded.jsonl")
    assert packed == decoded
    summary = [(p.id, len(p.tests), p.tests[0].fn_name) for p in packed if p.tests]
    assert summary == [
        ("codeforces/1873_A", 5, None),
        ("leetcode/2727", 14, "countSeniors"),
        ("atcoder/abc301_a", 15, None),
    ]
    assert packed[1].starter_code.startswith("class Solution:\n    def countSeniors(self")
    assert packed[0].starter_code == "" and packed[0].platform == "codeforces"
    # The prompt template reproduces the LiveCodeBench prompts stored in the file exactly.
    lines = (folder / "sandboxfusion_lcb_v1_sample.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [build_prompt(p) for p in packed] == [r["content"] for r in rows]


def test_codeforces_files(bench: Path) -> None:
    folder = bench / "codeforces"
    contests = load_benchmark("codeforces", folder / "sandboxfusion_code_contests_sample.jsonl")
    assert len(contests) == 20
    assert collections.Counter(p.platform for p in contests) == {"codeforces": 17, "codechef": 3}
    by_id = {p.id: p for p in contests}
    horses = by_id["codeforces/1000_A"]
    assert horses.difficulty == "A" and len(horses.tests or ()) == 102
    assert all(len(p.tests or ()) >= 35 for p in contests)
    elo = load_benchmark("codeforces", folder / "rllm_codeelo_test_codeforces.json")
    assert len(elo) == 408
    sizes = collections.Counter(len(p.tests or ()) for p in elo)
    assert sizes[1] == 378
    assert elo[0].tests == (
        TestCase(
            "stdio",
            "10\n1 9\n8 4\n1 4\n3 4\n2 0\n2 4\n6 9\n3 3\n0 0\n9 9",
            "1 9\n4 8\n1 4\n3 4\n0 2\n2 4\n6 9\n3 3\n0 0\n9 9",
        ),
    )
    assert elo[0].metadata["time_limit_s"] == 1.0 and elo[0].metadata["memory_limit_mb"] == 256


def test_two_copies_in_one_folder_is_an_error(bench: Path) -> None:
    with pytest.raises(GspoError, match="duplicate problem id '2024-I-1'"):
        load_benchmark("aime24", bench / "aime24")


def _hub_lcb_row(qid: str, day: str, private: str) -> dict[str, object]:
    return {
        "question_title": qid,
        "question_content": f"Solve {qid}.",
        "platform": "leetcode",
        "question_id": qid,
        "contest_id": "weekly-1",
        "contest_date": f"{day}T00:00:00",
        "starter_code": "class Solution:\n    def f(self, x: int) -> int:\n        ",
        "difficulty": "medium",
        "public_test_cases": json.dumps([{"input": "1", "output": "2", "testtype": "functional"}]),
        "private_test_cases": private,
        "metadata": json.dumps({"func_name": "f"}),
    }


def test_livecodebench_hub_format_and_date_window(tmp_path: Path) -> None:
    private = json.dumps([{"input": "3", "output": "4", "testtype": "functional"}])
    rows = [
        _hub_lcb_row("a", "2024-09-30", _compress(private)),
        _hub_lcb_row("b", "2024-10-01", private),
        _hub_lcb_row("c", "2025-02-01", _compress(private)),
    ]
    path = tmp_path / "test5.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_benchmark("livecodebench", path)
    assert problems[0].tests == (
        TestCase("call", "1", "2", fn_name="f"),
        TestCase("call", "3", "4", fn_name="f"),
    )
    assert problems[1].tests == problems[0].tests
    assert problems[0].contest_date == date(2024, 9, 30)
    window = load_benchmark("livecodebench", path, start="2024-10-01", end=date(2025, 1, 31))
    assert [p.id for p in window] == ["b"]
    assert [p.id for p in load_benchmark("livecodebench", path, start="2024-10-01")] == ["b", "c"]
    with pytest.raises(GspoError, match="no problems left"):
        load_benchmark("livecodebench", path, start="2026-01-01")
    with pytest.raises(GspoError, match="not YYYY-MM-DD"):
        load_benchmark("livecodebench", path, start="Oct 2024")


def test_undated_data_cannot_be_date_filtered(bench: Path) -> None:
    with pytest.raises(GspoError, match="no contest_date"):
        load_benchmark("livecodebench", start="2024-10-01")


def test_unpickling_is_restricted_to_plain_data() -> None:
    cases = {"inputs": ["1\n"], "outputs": ["2\n"], "fn_name": None}
    packed = _compress({"input_output": json.dumps(cases)})
    assert parse_tests(packed) == [TestCase("stdio", "1\n", "2\n")]
    evil = _compress(collections.OrderedDict(a=1))  # any class lookup is refused
    with pytest.raises(ValueError, match=r"refusing to load collections\.OrderedDict"):
        parse_tests(evil)
    with pytest.raises(ValueError, match="neither JSON nor"):
        parse_tests("definitely not tests")


def test_custom_with_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [{"Q": "What is 1+1?", "A": 2, "key": "p1"}, {"Q": "And 2+2?", "A": "4", "key": "p2"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    problems = load_benchmark("custom", path, columns={"question": "Q", "answer": "A", "id": "key"})
    assert [(p.id, p.kind, p.question, p.answer) for p in problems] == [
        ("p1", "math", "What is 1+1?", "2"),
        ("p2", "math", "And 2+2?", "4"),
    ]
    assert build_prompt(problems[0]).endswith(MATH_INSTRUCTION)
    with pytest.raises(GspoError, match=r"no column\(s\) \['Answer'\]"):
        load_benchmark("custom", path, columns={"question": "Q", "answer": "Answer"})
    with pytest.raises(GspoError, match=r"unknown field\(s\) \['gold'\]"):
        load_benchmark("custom", path, columns={"gold": "A"})
    with pytest.raises(GspoError, match="row 0: custom: needs an 'answer' or 'tests'"):
        load_benchmark("custom", path, columns={"question": "Q"})
    with pytest.raises(GspoError, match="--data PATH"):
        load_benchmark("custom")


def test_custom_code_from_parquet(tmp_path: Path) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    tests = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"], "fn_name": ""})
    table = pa.table({"statement": ["Add two numbers."], "io": [tests]})
    pq.write_table(table, tmp_path / "code.parquet")
    (problem,) = load_benchmark(
        "custom", tmp_path, columns={"question": "statement", "tests": "io"}
    )
    assert problem.kind == "code" and problem.id == "custom-0"
    assert problem.tests == (TestCase("stdio", "1 2\n", "3\n"),)
    assert "Read the inputs from stdin" in build_prompt(problem)


def test_bad_files_name_the_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "aime.jsonl"
    path.write_text('{"question": "q", "answer": "12"}\n{broken\n')
    with pytest.raises(GspoError, match=r"aime\.jsonl:2: not valid JSON"):
        load_benchmark("aime24", path)
    path.write_text('{"question": "q", "answer": "twelve"}\n')
    with pytest.raises(GspoError, match=r"aime\.jsonl: row 0: aime24: AIME answer 'twelve'"):
        load_benchmark("aime24", path)
    with pytest.raises(GspoError, match="no such file"):
        load_benchmark("gsm8k", tmp_path / "missing.jsonl")


def test_unknown_benchmark_lists_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_benchmark("aime23")
    message = str(info.value)
    assert "unknown benchmark 'aime23'" in message
    assert "aime24, aime25, codeforces, custom, gsm8k, livecodebench, math500" in message


def test_hub_failure_is_one_line_naming_data_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/aime_2024' on the Hub")

    monkeypatch.delenv(BENCHMARKS_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(GspoError) as info:
        load_benchmark("aime24")
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "cannot load 'HuggingFaceH4/aime_2024' from the hub (offline?) [ConnectionError]; "
        "pass a local file with --data PATH"
    )
    with pytest.raises(GspoError, match="cannot load 'me/my_set' from the hub"):
        load_benchmark("custom", hub_id="me/my_set")


def test_real_datasets_offline_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != BENCHMARKS_DIR_ENV}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    code = (
        "from gspo_cli.data import load_benchmark\n"
        "try:\n    load_benchmark('livecodebench')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.startswith(
        "GspoError cannot load 'livecodebench/code_generation_lite' from the hub (offline?)"
    )
    assert out.stdout.rstrip().endswith("pass a local file with --data PATH")
