"""The in-response Python interpreter: the model writes a ```python block, generation stops at
its end, the code sandbox runs it, and an ```output block is appended as environment tokens.

Each trajectory has one live sandboxed interpreter (sandbox/session.py), started at its first
call and ended with the trajectory: what a cell made (variables, imports, files, random draws)
is what the next cell sees, and a call costs the same whether it is the first or the eighth.
Like a notebook, a cell whose last statement is an expression prints its value. A call past
`timeout_s` or `output_max_bytes`, or one that ends the interpreter (os._exit, a signal, memory)
ends the session: the model is told so in one line, `tool_session_restarts` counts it, and the
next call starts a fresh interpreter.
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
from gspo_cli.sandbox.launch import Limits
from gspo_cli.sandbox.session import CellOutcome, SandboxSession

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PYTHON = "python"
# A complete code block; a model turn ends at the first one (the call).
CODE_BLOCK = re.compile(r"```(?:python|py)\n(.*?)```", re.S)
# Where an engine that only knows literal stop strings may stop early (vLLM); the turn is cut
# at CODE_BLOCK whatever the engine does, so a stop elsewhere only splits a turn in two.
STOP_STRINGS = ("```\n",)
OUTPUT_BLOCK = "\n```output\n{output}\n```\n"
RESTARTED = "the interpreter restarted; earlier variables are gone"


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
    """One trajectory's interpreter: a live session in the code sandbox."""

    def __init__(self, settings: ToolSettings, tokenizer: PreTrainedTokenizerBase) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.restarts = 0  # sessions a call ended (`tool_session_restarts`)
        limits = Limits(
            time_limit_s=settings.timeout_s,
            memory_limit_mb=settings.memory_mb,
            output_limit_bytes=settings.output_max_bytes,
        )
        # CPU time for the whole session: every call may use its deadline
        budget = settings.timeout_s * max(1, settings.max_calls)
        self.session = SandboxSession(
            limits, budget, allow_weak_isolation=settings.allow_weak_isolation
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
        """End the session (and whatever its cells started)."""
        self.session.close()

    def run_code(self, code: str) -> ToolResult:
        start = time.perf_counter()
        try:
            outcome = self.session.run(code)
        except WeakIsolationError:
            raise  # the user's setup, not this call: stop with the one-line reason
        except Exception as exc:  # the sandbox failed (fork, pipes, cgroups): answer, go on
            self.session.close()
            text = f"InternalError: the sandbox could not run the cell ({type(exc).__name__})"
            return ToolResult(text, True, time.perf_counter() - start)
        text = outcome.stdout.decode("utf-8", errors="replace")
        if outcome.error is not None and outcome.ended is None:
            text += ("\n" if text and not text.endswith("\n") else "") + outcome.error
        if outcome.ended is not None:
            self.restarts += 1
            text += f"\n{self._ending(outcome)}; {RESTARTED}"
        shown, cut = cut_output(
            text.strip("\n"),
            self.tokenizer,
            self.settings.output_max_tokens,
            self.settings.output_truncation,
        )
        ended = outcome.ended is not None
        failed = outcome.error is not None or ended
        return ToolResult(shown, failed, outcome.elapsed_s, cut, restarted=ended)

    def _ending(self, outcome: CellOutcome) -> str:
        """Why the call ended the session, in the model's terms."""
        s = self.settings
        if outcome.ended == "timeout":
            return f"TimeoutError: the cell ran past {s.timeout_s:g} s"
        if outcome.ended == "memory":
            return f"MemoryError: the interpreter used more than {s.memory_mb} MB"
        if outcome.ended == "output":
            return f"[output past {s.output_max_bytes} bytes dropped]"
        if outcome.ended == "protocol":
            return "InternalError: the interpreter's answer could not be read"
        if outcome.ended == "lost":
            return "InternalError: the interpreter was lost (the thread that started it ended)"
        code = outcome.exit_code
        how = "?" if code is None else f"signal {-code}" if code < 0 else f"exit code {code}"
        return f"ProcessExit: the cell ended the interpreter ({how})"
