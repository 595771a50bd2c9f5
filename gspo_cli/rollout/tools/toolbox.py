"""The tools of one trajectory (`FunctionToolbox`): users' functions, one instance of the
environment class (made, and reset with the dataset row, at its first use) and the interpreter,
each call under the tools' deadline.

A tool failing at run time (a bad call, an exception, a hung call) is answered to the model as
an error result, never raised. The environment's own life (`__init__`, `reset`, `get_reward`)
failing is the user's bug and stops the run with one line.
"""

from __future__ import annotations

import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gspo_cli.core.errors import GspoError
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import ToolCall, ToolResult, cut_output
from gspo_cli.rollout.tools.functions import ENVIRONMENT, environment_tools, first_line
from gspo_cli.rollout.tools.interpreter import PYTHON

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gspo_cli.rollout.tools.interpreter import PythonInterpreter


@dataclass(frozen=True)
class _Outcome:
    done: bool  # False: still running at the deadline
    value: Any = None
    error: BaseException | None = None


def _call_with_deadline(fn: Callable[[], Any], timeout_s: float, name: str) -> _Outcome:
    """`fn()` in a worker thread, waited for up to `timeout_s`."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # all of it goes back to the caller, SystemExit included
            box["error"] = exc

    # A daemon thread: Python cannot stop a thread, so a call that never returns is left
    # running; as a daemon it does not hold the process open at exit, and the toolbox that
    # started it refuses every later call (it may hold the environment's state or locks).
    thread = threading.Thread(target=work, name=f"gspo-tool-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return _Outcome(done=False)
    return _Outcome(done=True, value=box.get("value"), error=box.get("error"))


def result_text(value: Any) -> str:
    """What the model is shown of a return value: JSON for dicts and lists, str() otherwise."""
    if isinstance(value, dict | list):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):  # circular, or keys JSON cannot hold
            return str(value)
    return str(value)


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
        self.environment: Any = None
        self.functions = dict(functions)
        self.methods = (
            () if environment_class is None else tuple(environment_tools(environment_class))
        )
        self.broken: str | None = None  # why every later call is refused (a hung call)

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
            self._ensure_environment()
            fn = getattr(self.environment, call.name)
        elif call.name in self.functions:
            fn = self.functions[call.name]
        else:
            known = ", ".join(self.names) or "none"
            return _refusal(f"unknown tool {call.name!r}; the tools are: {known}")
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as exc:
            return _refusal(f"bad arguments for {call.name}: {exc}")
        start = time.perf_counter()
        outcome = _call_with_deadline(
            lambda: fn(**call.arguments), self.settings.timeout_s, call.name
        )
        seconds = time.perf_counter() - start
        if not outcome.done:
            self.broken = (
                f"the tools are unavailable: an earlier call ({call.name}) ran past "
                f"{self.settings.timeout_s:g} s"
            )
            text = f"TimeoutError: tool {call.name} ran past {self.settings.timeout_s:g} s"
            return _refusal(text, seconds)
        if outcome.error is not None:
            text = f"{type(outcome.error).__name__}: {outcome.error}"
            return self._result(text, error=True, seconds=seconds)
        return self._result(result_text(outcome.value), error=False, seconds=seconds)

    def _result(self, text: str, error: bool, seconds: float) -> ToolResult:
        """The tool's own output (a return value, an exception), cut to output_max_tokens."""
        shown, cut = cut_output(
            text, self.tokenizer, self.settings.output_max_tokens, self.settings.output_truncation
        )
        return ToolResult(shown, error, seconds, cut)

    def _lifecycle(self, what: str, fn: Callable[[], Any]) -> Any:
        """`fn()` (the environment's own code) under the deadline; GspoError when it fails."""
        outcome = _call_with_deadline(fn, self.settings.timeout_s, what)
        if not outcome.done:
            raise GspoError(f"{ENVIRONMENT}: {what} ran past {self.settings.timeout_s:g} s")
        if outcome.error is not None:
            raise GspoError(f"{ENVIRONMENT}: {what} failed ({first_line(outcome.error)})")
        return outcome.value

    def _ensure_environment(self) -> None:
        """The trajectory's environment, made and reset at its first use."""
        if self.environment is not None or self.environment_class is None:
            return
        cls = self.environment_class
        environment = self._lifecycle(f"{cls.__name__}()", cls)
        reset = getattr(environment, "reset", None)
        if reset is not None:
            row = _accepted(reset, self.row)
            self._lifecycle(f"{cls.__name__}.reset()", lambda: reset(**row))
        self.environment = environment

    def reward(self) -> float | None:
        """The environment's `get_reward()`; None without one, or after a hung call (the
        environment cannot be asked while that call may still run in it)."""
        cls = self.environment_class
        if cls is None or getattr(cls, "get_reward", None) is None or self.broken is not None:
            return None
        self._ensure_environment()
        value = self._lifecycle(f"{cls.__name__}.get_reward()", self.environment.get_reward)
        try:
            reward = float(value)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            raise GspoError(
                f"{ENVIRONMENT}: {cls.__name__}.get_reward() returned {value!r}; "
                "it must return a finite number"
            )
        return reward

    def close(self) -> None:
        self.environment = None
        self.interpreter = None
