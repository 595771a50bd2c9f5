"""The in-response Python interpreter: the model writes a ```python block, generation stops at
its end, the code sandbox runs it, and an ```output block is appended as environment tokens.

State between calls is kept by replay: each call runs the trajectory's earlier cells that ran
without error first (their output discarded), then the new cell, in one fresh sandbox process.
So variables, functions and imports of earlier cells are visible, every call gets the same
isolation and limits as the code reward, and nothing outlives the call; the cost is the earlier
cells' time, which counts toward the call's `timeout_s`. Like a notebook, a cell whose last
statement is an expression prints its value.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from gspo_cli.rollout.tools.base import (
    ToolCall,
    ToolResult,
    ToolSettings,
    cut_output,
    defuse,
    special_strings,
)
from gspo_cli.sandbox.isolation import WeakIsolationError
from gspo_cli.sandbox.program import Limits, run_program

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PYTHON = "python"
# A complete code block; a model turn ends at the first one (the call).
CODE_BLOCK = re.compile(r"```(?:python|py)\n(.*?)```", re.S)
# Where an engine that only knows literal stop strings may stop early (vLLM); the turn is cut
# at CODE_BLOCK whatever the engine does, so a stop elsewhere only splits a turn in two.
STOP_STRINGS = ("```\n",)
OUTPUT_BLOCK = "\n```output\n{output}\n```\n"

# Runs in the sandbox: earlier cells silently, then the last one, echoing its last expression.
_PROGRAM = """
import ast as _ast, contextlib as _contextlib, io as _io, sys as _sys
_cells = {cells!r}
_ns = {{"__name__": "__main__"}}
def _run(source, echo):
    tree = _ast.parse(source)
    last = tree.body.pop() if echo and tree.body and isinstance(tree.body[-1], _ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), _ns)
    if last is not None:
        value = eval(compile(_ast.Expression(last.value), "<cell>", "eval"), _ns)
        if value is not None:
            print(repr(value))
try:
    with _contextlib.redirect_stdout(_io.StringIO()):
        for _cell in _cells[:-1]:
            _run(_cell, False)
    _run(_cells[-1], True)
except BaseException as _exc:
    print(f"{{type(_exc).__name__}}: {{_exc}}")
    _sys.stdout.flush()
    _sys.exit(1)
"""


def replay_program(cells: list[str]) -> str:
    """The program one call runs: `cells[:-1]` replayed without output, then `cells[-1]`."""
    return _PROGRAM.format(cells=cells)


class CodeBlockFormat:
    """Calls are ```python blocks in the response; results are ```output blocks."""

    stop = CODE_BLOCK
    stop_strings = STOP_STRINGS

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.specials = special_strings(tokenizer)  # a program's output must not write one

    def calls(self, turn_text: str, ended: bool) -> list[ToolCall]:
        match = CODE_BLOCK.search(turn_text)
        return [] if match is None else [ToolCall(PYTHON, {"code": match.group(1)})]

    def result_ids(self, results: list[ToolResult]) -> list[int]:
        outputs = [defuse(r.text.rstrip("\n"), self.specials) for r in results]
        text = "".join(OUTPUT_BLOCK.format(output=output) for output in outputs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class PythonInterpreter:
    """One trajectory's interpreter: its cells so far, run in the code sandbox."""

    def __init__(self, settings: ToolSettings, tokenizer: PreTrainedTokenizerBase) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.cells: list[str] = []  # cells that ran without error, replayed before each call
        self.limits = Limits(
            time_limit_s=settings.timeout_s,
            memory_limit_mb=settings.memory_mb,
            output_limit_bytes=settings.output_max_bytes,
        )

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """The `Toolbox` of the code_block format: every call is Python."""
        return [
            ToolResult(call.error, True, 0.0) if call.error is not None
            else self.run_code(str(call.arguments.get("code", "")))
            for call in calls
        ]  # fmt: skip

    def reward(self) -> float | None:
        return None  # an interpreter has no reward of its own

    def close(self) -> None:
        """Nothing to free: each call's sandbox is gone with its call."""

    def run_code(self, code: str) -> ToolResult:
        start = time.perf_counter()
        try:
            outcome = run_program(
                replay_program([*self.cells, code]),
                limits=self.limits,
                allow_weak_isolation=self.settings.allow_weak_isolation,
            )
        except WeakIsolationError:
            raise  # the user's setup, not this call: stop with the one-line reason
        except Exception as exc:  # the sandbox failed (fork, pipes, cgroups): answer, go on
            text = f"InternalError: the sandbox could not run the cell ({type(exc).__name__})"
            return ToolResult(text, True, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        text = outcome.stdout.decode("utf-8", errors="replace")
        # the harness's status: "ok", or how the program ended (runtime_error, memory_limit...)
        failed = (outcome.status or {}).get("status") != "ok"
        if outcome.timed_out:
            text += f"\nTimeoutError: the cell ran past {self.settings.timeout_s:g} s"
        elif outcome.oom_killed:
            text += f"\nMemoryError: the cell used more than {self.settings.memory_mb} MB"
        elif outcome.output_limited:
            text += f"\n[output past {self.settings.output_max_bytes} bytes dropped]"
        elif failed and not text.strip():  # died before our handler could print
            tail = outcome.stderr_tail.strip().splitlines()
            text = tail[-1] if tail else f"exit status {outcome.returncode}"
        if not failed:
            self.cells.append(code)
        shown, cut = cut_output(
            text.strip("\n"),
            self.tokenizer,
            self.settings.output_max_tokens,
            self.settings.output_truncation,
        )
        return ToolResult(shown, failed, seconds, cut)
