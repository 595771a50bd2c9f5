"""Users' tools, as TRL has them: plain functions (`tools=`) and an environment class
(`environment_factory=`), described to the model by JSON schemas made from their signatures and
Google-style docstrings (transformers' `get_json_schema`, the convention chat templates read).

An environment class takes no `__init__` arguments; `reset(**row)` is optional and runs once
before its first call (with the dataset row's fields it names, all with **kwargs);
`get_reward()` is optional and scores the trajectory; every other public method is a tool.
One instance per trajectory, in its toolbox (tools/toolbox.py).

Loading problems (a module that is missing, a tool without a schema, two tools with one name)
are one-line GspoErrors naming the import path.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

from transformers.utils.chat_template_utils import get_json_schema

from gspo_cli.core.errors import GspoError
from gspo_cli.core.import_probe import probe_import
from gspo_cli.rollout.tools.interpreter import PYTHON

FUNCTIONS = "rollout.tools.functions"
ENVIRONMENT = "rollout.tools.environment"
LIFECYCLE = frozenset({"reset", "get_reward"})  # an environment's methods that are not tools


def python(code: str) -> str:
    """Run Python code; print what you want to see.

    Args:
        code: The Python code to run; earlier code of this conversation has run before it.
    """
    raise NotImplementedError  # a schema only: PythonInterpreter runs the calls


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def import_object(path: str, section: str) -> Any:
    """The object `path` ("module:name" or "module.name") names, with the working folder on
    the import path as for reward functions; GspoError naming `section` and `path`."""
    module_name, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise GspoError(f"{section}: {path!r} is not an import path (write module:name)")
    folder = os.getcwd()
    if folder not in sys.path:  # the console script's path starts at its own bin folder
        sys.path.append(folder)
    try:
        probe_import(path, module_name)  # in a child first: an exit or a hang there is one line
    except ValueError as exc:  # its message starts "reward 'PATH': "; the rest is the problem
        raise GspoError(f"{section}: {path!r}: {str(exc).partition(': ')[2]}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise GspoError(f"{section}: {path!r}: cannot import {module_name!r} ({exc})") from None
    except Exception as exc:  # user code: any import failure means "cannot use this tool"
        raise GspoError(
            f"{section}: {path!r}: importing {module_name!r} failed ({first_line(exc)})"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise GspoError(f"{section}: {path!r}: {module_name!r} has no {attr!r}") from None


def schema_of(fn: Callable[..., Any], section: str, path: str) -> dict[str, Any]:
    """`fn`'s tool schema (get_json_schema; `self` of an unbound method is skipped)."""
    try:
        return get_json_schema(fn)
    except Exception as exc:  # its parsing exceptions, or an unresolvable type hint
        raise GspoError(
            f"{section}: {path!r}: no tool schema can be made ({first_line(exc)}); a tool "
            "needs type hints and a Google-style docstring with an Args: line per argument"
        ) from None


def _reachable(obj: Any, section: str, path: str) -> None:
    """GspoError unless `obj` pickles by reference (its module and name): that is how the
    tools reach their worker process (tools/fork_server.py)."""
    try:
        pickle.dumps(obj)
    except Exception as exc:  # PicklingError, or an AttributeError naming a local object
        raise GspoError(
            f"{section}: {path!r} cannot reach the tools' process by its name "
            f"({first_line(exc)}); define it with def or class at a module's top level"
        ) from None


def load_functions(
    paths: tuple[str, ...], *, interpreter: bool = False
) -> dict[str, Callable[..., Any]]:
    """The functions `paths` name, by tool name (the function's `__name__`), each checked to
    have a schema; GspoError for a problem, or two tools with one name ("python" is the
    interpreter's when it is on)."""
    found: dict[str, Callable[..., Any]] = {}
    where: dict[str, str] = {}
    for path in paths:
        fn = import_object(path, FUNCTIONS)
        if not callable(fn) or inspect.isclass(fn):
            raise GspoError(f"{FUNCTIONS}: {path!r} is not a function")
        schema_of(fn, FUNCTIONS, path)
        _reachable(fn, FUNCTIONS, path)
        name = fn.__name__
        if name == PYTHON and interpreter:
            raise GspoError(
                f"{FUNCTIONS}: {path!r}: the tool name 'python' is the interpreter's "
                "(rename the function, or set rollout.tools.interpreter: null)"
            )
        if name in found:
            raise GspoError(f"{FUNCTIONS}: {where[name]!r} and {path!r} are both named {name!r}")
        found[name], where[name] = fn, path
    return found


def environment_tools(cls: type) -> dict[str, Callable[..., Any]]:
    """An environment class's tools: its public functions but `reset` and `get_reward`, by
    name (unbound: called with the instance)."""
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name not in LIFECYCLE
    }


def load_environment(path: str) -> type:
    """The environment class `path` names, checked: a class, `__init__` without arguments,
    callable `reset`/`get_reward` when present, at least one tool, a schema for each."""
    cls = import_object(path, ENVIRONMENT)
    if not inspect.isclass(cls):
        raise GspoError(f"{ENVIRONMENT}: {path!r} is not a class")
    try:
        required = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):  # no signature to read (a C class): it is called bare
        required = []
    if required:
        raise GspoError(
            f"{ENVIRONMENT}: {path!r}: __init__ must take no arguments (it takes "
            f"{', '.join(required)}); per-row data goes to reset(**row)"
        )
    for name in LIFECYCLE:
        if hasattr(cls, name) and not callable(getattr(cls, name)):
            raise GspoError(f"{ENVIRONMENT}: {path!r}: {name} is not a method")
    tools = environment_tools(cls)
    if not tools:
        raise GspoError(f"{ENVIRONMENT}: {path!r} has no public method to offer as a tool")
    for name, fn in tools.items():
        schema_of(fn, ENVIRONMENT, f"{path}.{name}")
    _reachable(cls, ENVIRONMENT, path)
    return cls


def tool_schemas(
    functions: Mapping[str, Callable[..., Any]], environment_class: type | None, interpreter: bool
) -> list[dict[str, Any]]:
    """The schemas the chat template shows: the interpreter's `python(code)`, the functions,
    the environment's methods, in that order; GspoError when two share a name."""
    named: list[tuple[str, Callable[..., Any], str]] = []
    if interpreter:
        named.append((PYTHON, python, "rollout.tools.interpreter"))
    named += [(name, fn, FUNCTIONS) for name, fn in functions.items()]
    if environment_class is not None:
        tools = environment_tools(environment_class)
        named += [(name, fn, ENVIRONMENT) for name, fn in tools.items()]
    seen: dict[str, str] = {}
    for name, _, section in named:
        if name in seen:
            raise GspoError(f"two tools are named {name!r} ({seen[name]} and {section})")
        seen[name] = section
    return [schema_of(fn, section, name) for name, fn, section in named]
