"""The tools of one trajectory (`FunctionToolbox`): users' functions, one instance of the
environment class (made, and reset with the dataset row, at its first use) and the interpreter,
each call under the tools' deadline. Functions and the environment run in the trajectory's own
worker process (tools/worker.py), which a call running past its deadline, or exiting, takes
down: the model is told, and every later call of the trajectory is refused (its state is gone).

A tool failing at run time (a bad call, an exception, a hung call, an exit) is answered to the
model as an error result, never raised. The environment's own life (`__init__`, `reset`,
`get_reward`) failing is the user's bug and stops the run with one line.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gspo_cli.core.errors import GspoError
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import MAX_CHARS_PER_TOKEN, ToolCall, ToolResult, cut_output
from gspo_cli.rollout.tools.functions import ENVIRONMENT, environment_tools
from gspo_cli.rollout.tools.interpreter import PYTHON
from gspo_cli.rollout.tools.worker import Op, Reply, ToolProcessGone, ToolSetup, ToolWorker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gspo_cli.rollout.tools.interpreter import PythonInterpreter


def _accepted(fn: Callable[..., Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `row` that `fn` takes by name (all of them when it takes **kwargs): a
    row has columns (the prompt, the answer) a reset need not name."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: give it everything
        return dict(row)
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return dict(row)
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {key: value for key, value in row.items() if key in names}


def _refusal(text: str, seconds: float = 0.0) -> ToolResult:
    """An error of gspo's own (a bad call, a timeout): short, and its start says what went
    wrong, so it is never cut as a tool's output is."""
    return ToolResult(text, True, seconds)


def _gone(what: str, gone: ToolProcessGone, timeout_s: float) -> str:
    """Why a call's worker is gone, as one line: "TimeoutError: tool f ran past 5 s"."""
    if gone.timed_out:
        return f"TimeoutError: {what} ran past {timeout_s:g} s"
    code = gone.exit_code
    if code is None:  # its fork server is gone too: how it ended is not known
        return f"ProcessExit: {what}: its process is gone"
    how = f"exit code {code}" if code >= 0 else f"signal {-code}"
    return f"ProcessExit: {what} ended its process ({how})"


class FunctionToolbox:
    """The tools of one trajectory: plain functions, one environment instance (made, and
    reset, at its first use) and the interpreter for calls named "python"."""

    def __init__(
        self,
        settings: ToolSettings,
        tokenizer: PreTrainedTokenizerBase,
        functions: Mapping[str, Callable[..., Any]],
        environment_class: type | None = None,
        interpreter: PythonInterpreter | None = None,
        row: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.environment_class = environment_class
        self.interpreter = interpreter
        self.row = dict(row or {})  # reset(**row): the dataset row's fields, as in TRL
        self.functions = dict(functions)
        self.methods = {} if environment_class is None else environment_tools(environment_class)
        self.worker = ToolWorker(
            ToolSetup(
                self.functions,
                environment_class,
                settings.output_max_tokens * MAX_CHARS_PER_TOKEN,
                settings.output_truncation,
            )
        )
        self.environment_made = False
        self.broken: str | None = None  # why every later call is refused (its worker is gone)

    @property
    def names(self) -> list[str]:
        python = [PYTHON] if self.interpreter is not None else []
        return [*python, *self.functions, *self.methods]

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        return [self._run_one(call) for call in calls]

    def _run_one(self, call: ToolCall) -> ToolResult:
        if call.error is not None:
            return _refusal(call.error)
        if self.broken is not None:
            return _refusal(self.broken)
        if call.name == PYTHON and self.interpreter is not None:
            code = call.arguments.get("code")
            if set(call.arguments) != {"code"} or not isinstance(code, str):
                return _refusal("python takes one argument: code (a string)")
            return self.interpreter.run_code(code)
        if call.name in self.methods:
            signature = inspect.signature(self.methods[call.name])
            bound_args: tuple[Any, ...] = (None,)  # `self`: the methods are unbound here
        elif call.name in self.functions:
            signature, bound_args = inspect.signature(self.functions[call.name]), ()
        else:
            known = ", ".join(self.names) or "none"
            return _refusal(f"unknown tool {call.name!r}; the tools are: {known}")
        try:
            signature.bind(*bound_args, **call.arguments)
        except TypeError as exc:
            return _refusal(f"bad arguments for {call.name}: {exc}")
        if call.name in self.methods:
            self._ensure_environment()
        start = time.perf_counter()
        try:
            reply = self.worker.request("call", call.name, call.arguments, self.settings.timeout_s)
        except ToolProcessGone as gone:
            text = _gone(f"tool {call.name}", gone, self.settings.timeout_s)
            self.broken = f"the tools are unavailable: an earlier call ended their process ({text})"
            return _refusal(text, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        # an exception keeps its head (its type and message), whatever side output keeps
        side = "head" if reply.raised else self.settings.output_truncation
        shown, cut = cut_output(
            reply.text, self.tokenizer, self.settings.output_max_tokens, side, reply.dropped
        )
        return ToolResult(shown, reply.raised, seconds, cut)

    def _lifecycle(self, op: Op, what: str, kwargs: Mapping[str, Any]) -> Reply:
        """The environment's own code in the worker, under the deadline; GspoError when it
        fails (the user's bug: the run stops)."""
        try:
            reply = self.worker.request(op, "", kwargs, self.settings.timeout_s)
        except ToolProcessGone as gone:
            why = _gone(what, gone, self.settings.timeout_s)
            raise GspoError(f"{ENVIRONMENT}: {why}") from None
        if reply.raised:
            first = reply.text.strip().splitlines()[0] if reply.text.strip() else "?"
            raise GspoError(f"{ENVIRONMENT}: {what} failed ({first})")
        return reply

    def _ensure_environment(self) -> None:
        """The trajectory's environment, made and reset at its first use."""
        if self.environment_made or self.environment_class is None:
            return
        cls = self.environment_class
        self._lifecycle("make", f"{cls.__name__}()", {})
        reset = getattr(cls, "reset", None)
        if reset is not None:
            self._lifecycle("reset", f"{cls.__name__}.reset()", _accepted(reset, self.row))
        self.environment_made = True

    def reward(self) -> float | None:
        """The environment's `get_reward()`; None without one, or after its worker was lost
        (a hung call or an exit took the environment's state with it)."""
        cls = self.environment_class
        if cls is None or getattr(cls, "get_reward", None) is None or self.broken is not None:
            return None
        self._ensure_environment()
        what = f"{cls.__name__}.get_reward()"
        reply = self._lifecycle("reward", what, {})
        if reply.number is None or not math.isfinite(reply.number):
            raise GspoError(
                f"{ENVIRONMENT}: {what} returned {reply.text}; it must return a finite number"
            )
        return reply.number

    def close(self) -> None:
        self.worker.close()
        if self.interpreter is not None:
            self.interpreter.close()
            self.interpreter = None
