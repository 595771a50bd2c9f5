"""Users' tools (rollout/tools/functions.py, toolbox.py, build.py): functions and an
environment class loaded by import path with schemas from their docstrings, one-line errors for
what cannot be used, and the per-trajectory toolbox that answers every failure to the model
instead of raising (a bad call, an exception, a hung call)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import ToolCall
from gspo_cli.rollout.tools.build import make_tool_parts, tool_schemas_for
from gspo_cli.rollout.tools.functions import load_environment, load_functions, tool_schemas
from gspo_cli.rollout.tools.interpreter import CodeBlockFormat, PythonInterpreter
from gspo_cli.rollout.tools.toolbox import FunctionToolbox
from tests.support.helpers import tool_module

MODULE = "gspo_test_tool_module"
SOURCE = '''
import math
import pathlib

LOG = pathlib.Path(__file__).with_name("calls.log")  # the calls that ran, in their worker
NOT_CALLABLE = 3


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    with LOG.open("a") as log:
        log.write(f"add {a} {b}\\n")
    return a + b


def boom(x: str) -> str:
    """Fail.

    Args:
        x: Anything.
    """
    raise ValueError("no " + x)


def info() -> dict:
    """Facts."""
    return {"k": [1, 2]}


def long_text() -> str:
    """A long answer."""
    return "abcdefghij" * 10


def spin() -> str:
    """Never return."""
    while True:
        pass


def _make_local():
    def local(a: int) -> int:
        """A function made inside another.

        Args:
            a: A number.
        """
        return a

    return local


local = _make_local()


def undocumented(a: int) -> int:
    return a


def unhinted(a):
    """No hints.

    Args:
        a: A thing.
    """


def python(code: str) -> str:
    """The interpreter's name.

    Args:
        code: Code.
    """
    return code


class Counter:
    def __init__(self) -> None:
        self.count = 0
        self.target = 3

    def reset(self, target: int = 3) -> None:
        self.target = target

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much.
        """
        self.count += by
        return self.count

    def get_reward(self) -> float:
        return float(self.count == self.target)

    def _helper(self) -> None:
        pass


class NanReward(Counter):
    def get_reward(self) -> float:
        return math.nan


class RaisingReward(Counter):
    def get_reward(self) -> float:
        raise KeyError("score")


class NoReward:
    def look(self) -> str:
        """Look."""
        return "a room"


class NeedsArgs:
    def __init__(self, size: int) -> None:
        self.size = size

    def act(self) -> str:
        """Act."""
        return ""
'''


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example tool module, importable as MODULE."""
    with tool_module(tmp_path, monkeypatch, MODULE, SOURCE, "add") as module:
        yield module


def _calls(tools: ModuleType) -> list[str]:
    """The calls that ran (logged by the tools in their worker process)."""
    return tools.LOG.read_text().splitlines() if tools.LOG.exists() else []


def _toolbox(module: ModuleType, **settings: Any) -> FunctionToolbox:
    names = ("add", "boom", "info", "long_text", "spin")
    functions = {name: getattr(module, name) for name in names}
    return FunctionToolbox(ToolSettings(**settings), build_char_tokenizer(), functions)


def test_functions_load_by_either_path_form_with_schemas(tools: ModuleType) -> None:
    functions = load_functions((f"{MODULE}:add", f"{MODULE}.info"), interpreter=True)
    assert list(functions) == ["add", "info"]
    schemas = tool_schemas(functions, load_environment(f"{MODULE}:Counter"), interpreter=True)
    by_name = {s["function"]["name"]: s["function"] for s in schemas}
    assert list(by_name) == ["python", "add", "info", "increment"]
    assert by_name["add"]["description"] == "Add two numbers."
    assert by_name["add"]["parameters"]["required"] == ["a", "b"]
    assert by_name["python"]["parameters"]["properties"]["code"]["type"] == "string"
    assert set(by_name["increment"]["parameters"]["properties"]) == {"by"}  # no self


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("gspo_no_such_module_xyz:f", "cannot import"),
        (f"{MODULE}:missing", "has no 'missing'"),
        (f"{MODULE}:NOT_CALLABLE", "is not a function"),
        (f"{MODULE}:Counter", "is not a function"),
        (f"{MODULE}:undocumented", "no tool schema can be made"),
        (f"{MODULE}:unhinted", "no tool schema can be made"),
        (f"{MODULE}:local", "cannot reach the tools' process by its name"),
        ("nocolon", "is not an import path"),
    ],
)
def test_an_unusable_function_is_one_line_naming_it(
    tools: ModuleType, path: str, problem: str
) -> None:
    with pytest.raises(GspoError) as caught:
        load_functions((path,))
    message = str(caught.value)
    assert problem in message and repr(path) in message and "\n" not in message


def test_two_tools_with_one_name_are_refused(tools: ModuleType) -> None:
    with pytest.raises(GspoError, match="are both named 'add'"):
        load_functions((f"{MODULE}:add", f"{MODULE}.add"))
    with pytest.raises(GspoError, match="'python' is the interpreter's"):
        load_functions((f"{MODULE}:python",), interpreter=True)
    assert list(load_functions((f"{MODULE}:python",))) == ["python"]  # no interpreter: free
    with pytest.raises(GspoError, match="two tools are named 'increment'"):
        tool_schemas({"increment": tools.add}, tools.Counter, interpreter=False)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("NeedsArgs", "__init__ must take no arguments (it takes size)"),
        ("add", "is not a class"),
    ],
)
def test_an_unusable_environment_is_one_line(tools: ModuleType, name: str, problem: str) -> None:
    with pytest.raises(GspoError, match=re.escape(problem)) as caught:
        load_environment(f"{MODULE}:{name}")
    assert "rollout.tools.environment" in str(caught.value)


def test_calls_run_and_every_failure_is_an_answer(tools: ModuleType) -> None:
    toolbox = _toolbox(tools)
    results = toolbox.run(
        [
            ToolCall("add", {"a": 2, "b": 3}),
            ToolCall("info", {}),
            ToolCall("boom", {"x": "way"}),
            ToolCall("nope", {}),
            ToolCall("add", {"a": 1}),
            ToolCall("add", {"a": 1, "b": 1}, error="invalid tool call: not JSON"),
        ]
    )
    assert [(r.text, r.error) for r in results[:3]] == [
        ("5", False),
        ('{"k": [1, 2]}', False),
        ("ValueError: no way", True),
    ]
    assert results[3].error and "unknown tool 'nope'" in results[3].text
    assert "add, boom" in results[3].text
    assert results[4].error and results[4].text.startswith("bad arguments for add")
    assert (results[5].text, results[5].error) == ("invalid tool call: not JSON", True)
    assert _calls(tools) == ["add 2 3"]  # neither the bad arguments nor the bad call ran


def test_a_long_result_is_cut_to_output_max_tokens(tools: ModuleType) -> None:
    (result,) = _toolbox(tools, output_max_tokens=8, output_truncation="head").run(
        [ToolCall("long_text", {})]
    )
    assert result.cut and result.text == "abcdefgh\n[... 92 tokens cut]"


def test_a_hung_call_times_out_and_the_toolbox_refuses_more(tools: ModuleType) -> None:
    toolbox = _toolbox(tools, timeout_s=0.2)
    hung, later = toolbox.run([ToolCall("spin", {}), ToolCall("add", {"a": 1, "b": 2})])
    assert hung.error and hung.text == "TimeoutError: tool spin ran past 0.2 s"
    assert hung.seconds < 5
    assert later.error and "unavailable" in later.text
    assert _calls(tools) == []  # the call after the hung one never ran


def test_the_environment_is_one_per_toolbox_reset_with_the_row(tools: ModuleType) -> None:
    def toolbox(row: dict[str, Any] | None) -> FunctionToolbox:
        settings, tokenizer = ToolSettings(), build_char_tokenizer()
        return FunctionToolbox(settings, tokenizer, {}, tools.Counter, None, row)

    first = toolbox({"target": 2, "prompt": "Count to 2."})  # reset takes only target
    results = first.run([ToolCall("increment", {"by": 1}), ToolCall("increment", {"by": 1})])
    assert [r.text for r in results] == ["1", "2"]
    assert first.reward() == 1.0  # reached the row's target
    assert toolbox(None).reward() == 0.0  # a fresh instance: count 0, the default target 3
    plain = FunctionToolbox(ToolSettings(), build_char_tokenizer(), {}, tools.NoReward)
    assert plain.run([ToolCall("look", {})])[0].text == "a room" and plain.reward() is None
    assert _toolbox(tools).reward() is None  # no environment


@pytest.mark.parametrize(("name", "problem"), [("NanReward", "nan"), ("RaisingReward", "KeyError")])
def test_a_bad_get_reward_is_one_line(tools: ModuleType, name: str, problem: str) -> None:
    toolbox = FunctionToolbox(ToolSettings(), build_char_tokenizer(), {}, getattr(tools, name))
    with pytest.raises(GspoError, match=rf"{name}\.get_reward\(\).*{problem}") as caught:
        toolbox.reward()
    assert "\n" not in str(caught.value)


def test_python_calls_run_in_the_interpreter_with_state() -> None:
    settings, tokenizer = ToolSettings(), build_char_tokenizer()
    toolbox = FunctionToolbox(settings, tokenizer, {}, None, PythonInterpreter(settings, tokenizer))
    results = toolbox.run(
        [
            ToolCall("python", {"code": "x = 2"}),
            ToolCall("python", {"code": "print(x * 21)"}),
            ToolCall("python", {"source": "1"}),
        ]
    )
    assert [(r.text, r.error) for r in results[:2]] == [("", False), ("42", False)]
    assert results[2].error and "code (a string)" in results[2].text


def test_code_blocks_know_only_the_interpreter(tools: ModuleType) -> None:
    tokenizer = build_char_tokenizer()
    with pytest.raises(GspoError, match=r"rollout\.tools\.functions needs format: chat_template"):
        make_tool_parts(ToolSettings(functions=(f"{MODULE}:add",)), tokenizer, "tiny")
    with pytest.raises(GspoError, match="code_block needs interpreter: python"):
        make_tool_parts(ToolSettings(interpreter=None), tokenizer, "tiny")
    fmt, make_toolbox = make_tool_parts(ToolSettings(), tokenizer, "tiny")
    assert isinstance(fmt, CodeBlockFormat) and tool_schemas_for(ToolSettings()) is None
    first, second = make_toolbox(), make_toolbox()
    assert first.interpreter is not None and first.interpreter is not second.interpreter


def test_chat_template_settings_give_the_prompts_their_schemas(tools: ModuleType) -> None:
    settings = ToolSettings(
        format="chat_template", functions=(f"{MODULE}:add",), environment=f"{MODULE}:Counter"
    )
    schemas = tool_schemas_for(settings)
    assert schemas is not None
    assert [s["function"]["name"] for s in schemas] == ["python", "add", "increment"]
    with pytest.raises(GspoError, match="offers no tool"):
        tool_schemas_for(ToolSettings(format="chat_template", interpreter=None))
