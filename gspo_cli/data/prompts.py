"""Prompt rendering: a plain question or a conversation, through the tokenizer's chat template.

The one place that decides how a prompt becomes token ids, for training, held-out evaluation and
`gspo eval` alike:

- a plain string prompt is formatted by `prompt_template` and becomes one user turn, after a
  system turn when `system_prompt` is set;
- a conversation (a list of {role, content} messages, TRL's conversational format) is rendered
  as it is, system turns kept; `system_prompt` goes first only when it has no system turn of its
  own; the default `prompt_template` (the \\boxed{} instruction) is for plain questions and is
  not applied to it, while any other template, which the user wrote on purpose, is applied to
  the content of its last user turn;
- the chat template opens the assistant's turn (add_generation_prompt) and gets
  `chat_template_kwargs` (e.g. Qwen3's enable_thinking);
- `chat_template: none` feeds the formatted question as raw text (as for a base model); a
  tokenizer without a chat template is an error otherwise, never a silent fallback;
- `chat_template: hermes` renders with ChatML + Hermes tool calls (data/chat_templates.py) in
  place of the tokenizer's: tool calls for ChatML models whose template has none.

A prompt that cannot be rendered is a GspoError naming `where` (the row or problem).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gspo_cli.core.errors import GspoError
from gspo_cli.data.chat_templates import HERMES_TOOL_TEMPLATE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_TEMPLATE = "{prompt}\nPut the final answer in \\boxed{{}}."
IDENTITY = "{prompt}"  # the question as it is (gspo eval without a template of its own)
# apply_chat_template's own parameters: as template variables they would change how it renders
# (or what it returns), not what the template reads.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "padding", "truncation", "max_length",
        "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)  # fmt: skip
NO_TEMPLATE = (
    "the tokenizer has no chat template: set data.chat_template: none to feed prompts as raw "
    "text (gspo eval: --set data.chat_template=none)"
)

Prompt = str | Sequence[Mapping[str, Any]]


class PromptSettings(Protocol):
    """How prompts are rendered: the recipe's data section has these fields (read-only here)."""

    @property
    def prompt_template(self) -> str: ...
    @property
    def system_prompt(self) -> str | None: ...
    @property
    def chat_template(self) -> str: ...  # "auto" | "none" | "hermes"
    @property
    def chat_template_kwargs(self) -> Mapping[str, Any]: ...


class TemplateChoice(Protocol):
    """Which chat template renders the model's turns, and its variables (data.chat_template)."""

    @property
    def chat_template(self) -> str: ...
    @property
    def chat_template_kwargs(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class PromptFormat:
    """`PromptSettings` outside a recipe's data section (benchmarks, `gspo eval`)."""

    prompt_template: str = "{prompt}"
    system_prompt: str | None = None
    chat_template: str = "auto"
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)


PLAIN = PromptFormat()


def template_kwargs(choice: TemplateChoice) -> dict[str, Any]:
    """What apply_chat_template gets besides the turns, wherever they are rendered (prompts,
    tool turns, the template's checks): the template's variables and, for `hermes`, the
    template itself in place of the tokenizer's."""
    own = {"chat_template": HERMES_TOOL_TEMPLATE} if choice.chat_template == "hermes" else {}
    return {**choice.chat_template_kwargs, **own}


def check_template_kwargs(kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """ValueError for a key that is one of apply_chat_template's own parameters."""
    taken = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if taken:
        raise ValueError(f"{taken[0]!r} is a parameter of apply_chat_template, not a variable")
    return kwargs


def prompt_messages(prompt: Prompt, fmt: PromptSettings) -> list[dict[str, Any]]:
    """The turns `prompt` is asked as (module docstring); ValueError for one it cannot be."""
    system = [] if fmt.system_prompt is None else [{"role": "system", "content": fmt.system_prompt}]
    if isinstance(prompt, str):
        return [*system, {"role": "user", "content": fmt.prompt_template.format(prompt=prompt)}]
    messages = [dict(m) for m in prompt]
    if fmt.prompt_template not in (DEFAULT_TEMPLATE, IDENTITY):
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise ValueError("data.prompt_template goes into the last user turn; there is none")
        last = messages[users[-1]]
        last["content"] = fmt.prompt_template.format(prompt=last["content"])
    if any(m.get("role") == "system" for m in messages):
        return messages
    return [*system, *messages]


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    fmt: PromptSettings = PLAIN,
    where: str = "prompt",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of one prompt (module docstring); GspoError naming `where` when it fails.
    `tools` (JSON schemas) go to the chat template, which shows them to the model (tool use
    with format: chat_template); None renders exactly as before."""
    if fmt.chat_template == "none":
        if not isinstance(prompt, str):
            raise GspoError(f"{where}: a conversation needs a chat template (data.chat_template)")
        return list(tokenizer(fmt.prompt_template.format(prompt=prompt))["input_ids"])
    variables = template_kwargs(fmt)
    if not (getattr(tokenizer, "chat_template", None) or "chat_template" in variables):
        raise GspoError(NO_TEMPLATE)
    try:
        messages = prompt_messages(prompt, fmt)
    except ValueError as exc:
        raise GspoError(f"{where}: {exc}") from None
    shown: dict[str, Any] = {} if tools is None else {"tools": [dict(tool) for tool in tools]}
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            **shown,
            **variables,
        )
    except Exception as exc:  # a template is user code (jinja): any failure is this prompt's
        lines = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        raise GspoError(f"{where}: the chat template cannot render it ({detail})") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
