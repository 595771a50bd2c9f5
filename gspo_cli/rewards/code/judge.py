"""Judge one program against its tests (many in parallel on gspo_cli.sandbox.pool).

Each test is one sandboxed run (sandbox.run_program), so no state carries between tests.
Verdicts: accepted, wrong_answer, runtime_error, timeout, memory_limit, output_limit,
syntax_error, no_code, blocked (the fallback guard refused something), and internal_error
(the sandbox itself failed; logged, and scored 0 like any failure). A verdict rests only on
what the program cannot forge: its stdout or its call results, compared here, or the status of
the harness's checker process, which the program's process cannot reach.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from typing import Any

from gspo_cli.data.testcases import TestCase, parse_tests
from gspo_cli.rewards.code.compare import compare_json, compare_stdout
from gspo_cli.rewards.code.extract import extract_code
from gspo_cli.sandbox.isolation import WeakIsolationError, checked_mode
from gspo_cli.sandbox.launch import Limits
from gspo_cli.sandbox.program import RunOutcome, run_program

log = logging.getLogger(__name__)

VERDICTS = (
    "accepted", "wrong_answer", "runtime_error", "timeout", "memory_limit", "output_limit",
    "syntax_error", "no_code", "blocked", "internal_error",
)  # fmt: skip
# The same for every test of a program: judging more tests cannot change them.
FINAL = frozenset({"syntax_error", "no_code", "internal_error"})


@dataclass(frozen=True)
class TestVerdict:
    """One test's outcome."""

    __test__ = False  # not a pytest class

    index: int
    verdict: str
    elapsed_s: float = 0.0
    detail: str = ""


@dataclass
class JudgeResult:
    """One program's outcome: the first failing test's verdict, or accepted."""

    verdict: str
    passed: int
    total: int
    tests: list[TestVerdict] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def reward(self, partial: bool = False) -> float:
        """1.0 when accepted; with `partial`, the fraction of tests passed."""
        if partial:
            return self.fraction
        return 1.0 if self.verdict == "accepted" else 0.0


def classify(outcome: RunOutcome, case: TestCase) -> tuple[str, str]:
    """(verdict, detail) for one run of one test."""
    status = (outcome.status or {}).get("status")
    error = str((outcome.status or {}).get("error", ""))
    if outcome.output_limited:
        return "output_limit", "output cap exceeded"
    if outcome.timed_out or outcome.signal == signal.SIGXCPU:
        return "timeout", f"killed after {outcome.elapsed_s:.2f}s"
    if outcome.oom_killed:
        return "memory_limit", "the run's memory cgroup hit its limit"
    if status in ("syntax_error", "memory_limit", "blocked", "wrong_answer", "internal_error"):
        return status, error
    if status != "ok":
        if "MemoryError" in outcome.stderr_tail:
            return "memory_limit", "MemoryError"
        sig, code = outcome.signal, (outcome.status or {}).get("exit")
        return "runtime_error", error or (f"signal {sig}" if sig else f"exit {code}")
    if case.kind == "assert":
        return "accepted", ""
    if case.kind == "call":
        if outcome.call_result is None:
            return "runtime_error", "no result"
        ok = compare_json(outcome.call_result, case.output)
        return ("accepted", "") if ok else ("wrong_answer", outcome.call_result[:200])
    got = outcome.stdout.decode("utf-8", errors="replace")
    return ("accepted", "") if compare_stdout(got, case.output) else ("wrong_answer", got[:200])


def _run_case(code: str, case: TestCase, limits: Limits, isolation: str) -> RunOutcome:
    options: dict[str, Any] = {
        "limits": limits,
        "isolation": isolation,
        "allow_weak_isolation": True,
    }
    if case.kind == "assert":
        return run_program(code, mode="assert", check=case.check, **options)
    mode = "call" if case.kind == "call" else "stdio"
    return run_program(code, mode=mode, stdin=case.input, fn_name=case.fn_name, **options)


def judge_program(
    code: str,
    tests: Any,
    *,
    time_limit_s: float = 6.0,
    memory_limit_mb: int = 1024,
    all_tests: bool = False,
    max_tests: int | None = None,
    limits: Limits | None = None,
    isolation: str | None = None,
    allow_weak_isolation: bool | None = None,
) -> JudgeResult:
    """Run `code` on each test (any format testcases.parse_tests knows), stopping at the first
    failure unless `all_tests`. Raises TestFormatError for unreadable tests, and
    WeakIsolationError when only a weak sandbox is available without the opt-in."""
    isolation = checked_mode(isolation, allow_weak_isolation)
    cases = parse_tests(tests)[:max_tests]
    limits = limits or Limits(time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb)
    result = JudgeResult("accepted", 0, len(cases))
    for index, case in enumerate(cases):
        outcome = _run_case(code, case, limits, isolation)
        verdict, detail = classify(outcome, case)
        if verdict == "internal_error":
            log.warning("code judge: the sandbox harness failed: %s", detail)
        result.tests.append(TestVerdict(index, verdict, outcome.elapsed_s, detail))
        if verdict == "accepted":
            result.passed += 1
            continue
        if result.verdict == "accepted":
            result.verdict = verdict
        if not all_tests or verdict in FINAL:
            break
    if not cases:
        result.verdict = "internal_error"  # nothing to judge against is a data error
    return result


def judge_completion(completion: str, tests: Any, **options: Any) -> JudgeResult:
    """Extract the program from a model completion, then judge it. Never raises for anything
    the program does; raises WeakIsolationError when the sandbox refuses to run at all."""
    code = extract_code(completion)
    if code is None:
        return JudgeResult("no_code", 0, 0)
    try:
        return judge_program(code, tests, **options)
    except WeakIsolationError:
        raise  # the user's setup, not this program: stop with the one-line reason
    except Exception as exc:  # bad test data or a sandbox failure: score 0, keep training
        log.warning("code judge: %s: %s", type(exc).__name__, exc)
        return JudgeResult("internal_error", 0, 0, [TestVerdict(0, "internal_error", 0, str(exc))])
