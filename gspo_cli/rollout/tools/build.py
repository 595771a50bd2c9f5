"""The parts a tool-using rollout is built from, from `rollout.tools` as plain settings: the
format (code blocks, or the model's chat template) and the factory of one trajectory's toolbox.

`code_block` knows only the interpreter (a ```python block is its one kind of call); users'
functions, environments and OpenEnv servers need `chat_template`, where calls name their tool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from gspo_cli.core.errors import GspoError
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import Toolbox, ToolFormat
from gspo_cli.rollout.tools.chat_template import ChatTemplateFormat, check_prefix_preserving
from gspo_cli.rollout.tools.functions import load_environment, load_functions, tool_schemas
from gspo_cli.rollout.tools.interpreter import CodeBlockFormat, PythonInterpreter
from gspo_cli.rollout.tools.openenv_server import OPENENV, server_for, step_tool_schema
from gspo_cli.rollout.tools.openenv_session import OpenEnvToolbox
from gspo_cli.rollout.tools.toolbox import FunctionToolbox

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class ToolboxFactory(Protocol):
    """A new toolbox for one trajectory; `row` (the dataset row) goes to `reset(**row)`."""

    def __call__(self, row: Mapping[str, Any] | None = None) -> Toolbox: ...


def _check_openenv(settings: ToolSettings) -> None:
    """An OpenEnv environment is the trajectory's one tool (GspoError otherwise)."""
    if settings.format != "chat_template":
        raise GspoError(f"{OPENENV} needs format: chat_template (its action is a tool call)")
    if settings.interpreter or settings.functions or settings.environment:
        raise GspoError(
            f"{OPENENV} is the trajectory's one tool: set interpreter: null and no functions "
            "or environment beside it"
        )
    step_tool_schema(settings.openenv or "")  # the module or server, checked now


def _loaded(settings: ToolSettings) -> tuple[dict[str, Callable[..., Any]], type | None]:
    """The functions and the environment class `settings` name, checked (GspoError)."""
    if settings.openenv:
        _check_openenv(settings)
        return {}, None
    if settings.format == "code_block":
        named = {"functions": settings.functions, "environment": settings.environment}
        for section, value in named.items():
            if value:
                raise GspoError(
                    f"rollout.tools.{section} needs format: chat_template (the code_block "
                    "format runs only the interpreter)"
                )
        if settings.interpreter is None:
            raise GspoError("rollout.tools.format: code_block needs interpreter: python")
        return {}, None
    on = settings.interpreter is not None
    functions = load_functions(settings.functions, interpreter=on)
    environment = load_environment(settings.environment) if settings.environment else None
    if not (on or functions or environment):
        raise GspoError(
            "rollout.tools offers no tool: set interpreter: python, functions or environment"
        )
    tool_schemas(functions, environment, on)  # two tools with one name
    return functions, environment


def tool_schemas_for(settings: ToolSettings) -> list[dict[str, Any]] | None:
    """The tool schemas a prompt shows (render_prompt's `tools`): None for code_block, whose
    prompts name no tools; GspoError for settings that cannot work (recipe validation)."""
    functions, environment = _loaded(settings)
    if settings.format == "code_block":
        return None
    if settings.openenv:
        return [step_tool_schema(settings.openenv)]
    return tool_schemas(functions, environment, settings.interpreter is not None)


def tool_template_problem(
    tools: ToolSettings | None,
    tokenizer: PreTrainedTokenizerBase | None,
    model_name: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """The one line refusing `format: chat_template` on a template that cannot render tool
    turns (check_prefix_preserving), or None: asked at validate time, before a run folder."""
    if tools is None or tools.format != "chat_template" or tokenizer is None:
        return None
    try:
        check_prefix_preserving(tokenizer, model_name, template_kwargs)
    except GspoError as exc:
        return f"rollout.tools.format: {exc}"
    return None


def make_tool_parts(
    settings: ToolSettings,
    tokenizer: PreTrainedTokenizerBase,
    model_name: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[ToolFormat, ToolboxFactory]:
    """The format and toolbox factory for `settings`; `template_kwargs` are the prompts' chat
    template variables (data.chat_template_kwargs). GspoError for what cannot work."""
    functions, environment = _loaded(settings)
    fmt: ToolFormat
    if settings.format == "code_block":
        # a cast: its `stop` is a Pattern, never None, and a Protocol's plain attribute is
        # invariant (a read-only `stop` property in base.ToolFormat would need none)
        fmt = cast("ToolFormat", CodeBlockFormat(tokenizer))
    else:
        check_prefix_preserving(tokenizer, model_name, template_kwargs)
        fmt = ChatTemplateFormat(tokenizer, template_kwargs)
    if settings.openenv:
        server = server_for(settings.openenv)
        return fmt, lambda row=None: OpenEnvToolbox(settings, tokenizer, server, row)
    interpreter = settings.interpreter is not None

    def make_toolbox(row: Mapping[str, Any] | None = None) -> FunctionToolbox:
        return FunctionToolbox(
            settings,
            tokenizer,
            functions,
            environment,
            PythonInterpreter(settings, tokenizer) if interpreter else None,
            row,
        )

    return fmt, make_toolbox
