"""Tool calls through the model's own chat template (Hermes style: Qwen2.5, Qwen3, ...).

The model writes `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` in its turn and
ends the turn with end-of-turn (eos). The tool turn that answers it is what the template writes
after that eos (a newline, the tool turn with its `<tool_response>` blocks, the opening of the
next assistant turn). It is found by rendering, never by re-encoding the history: a probe
conversation is rendered with and without the tool messages, and the text after the probe's
eos is tokenised once. That is right only for a template whose rendering of a conversation
starts with its rendering of any shorter one (prefix-preserving), which
`check_prefix_preserving` checks once at start.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gspo_cli.core.errors import GspoError
from gspo_cli.rollout.tools.base import ToolCall, ToolResult, defuse, special_strings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)
BAD_CALL = "?"  # the name of a call that could not be read
USE_CODE_BLOCK = (
    "use rollout.tools.format: code_block (or, for a ChatML model, data.chat_template: hermes)"
)

# The probe: a tool, a question, a turn that calls it (its reasoning kept: a template that drops
# earlier reasoning is not prefix-preserving), the tool's answer, a final turn.
PROBE_TOOL = "probe_tool"
PROBE_RESULT = "probe result 42"
_SCHEMA = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL,
        "description": "A probe.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer", "description": "A number."}},
            "required": ["x"],
        },
    },
}
_USER = {"role": "user", "content": "probe question"}
_FINAL = {"role": "assistant", "content": "probe answer"}


def _calling_turn(n: int) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": PROBE_TOOL, "arguments": {"x": 1}}}
    content = "<think>\nprobe reasoning\n</think>\n\nprobe text"
    return {"role": "assistant", "content": content, "tool_calls": [call] * n}


def _tool_turns(texts: list[str]) -> list[dict[str, Any]]:
    return [{"role": "tool", "name": PROBE_TOOL, "content": text} for text in texts]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _difference(shorter: str, longer: str) -> str:
    """Where `longer` stops starting with `shorter`, briefly."""
    at = next((i for i, (a, b) in enumerate(zip(shorter, longer, strict=False)) if a != b),
              min(len(shorter), len(longer)))  # fmt: skip
    return f"at character {at}: {shorter[at : at + 24]!r} became {longer[at : at + 24]!r}"


class _Renderer:
    """The template, rendered as text with the probe's tool and the prompts' kwargs."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, template_kwargs: Mapping[str, Any] | None
    ) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})

    def __call__(self, messages: list[dict[str, Any]], generation: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=[_SCHEMA],
            tokenize=False,
            add_generation_prompt=generation,
            **self.kwargs,
        )
        return str(text)


def parse_call(body: str) -> ToolCall:
    """One `<tool_call>` body as a call, or as a call with `.error` saying what is wrong."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(BAD_CALL, {}, f"invalid tool call: not JSON ({exc})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(BAD_CALL, {}, 'invalid tool call: it needs a "name" string')
    name, arguments = obj["name"], obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, f'invalid tool call to {name}: "arguments" must be an object')
    return ToolCall(name, arguments)


class ChatTemplateFormat:
    """Calls are `<tool_call>` JSON in a finished turn; results are the template's tool turn."""

    stop: re.Pattern[str] | None = (
        None  # a turn ends at end-of-turn only: the calls are in the finished turn
    )
    stop_strings: tuple[str, ...] = ()

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.render = _Renderer(tokenizer, template_kwargs)
        self.eos = str(tokenizer.eos_token)
        self.specials = special_strings(tokenizer)  # a tool's output must not write one

    def calls(self, turn_text: str, ended: bool) -> list[ToolCall]:
        if not ended:  # cut by the token budget: its calls are not finished
            return []
        found, end = [], 0
        for match in TOOL_CALL.finditer(turn_text):
            found.append(parse_call(match.group(1)))
            end = match.end()
        if OPEN in turn_text[end:]:
            found.append(ToolCall(BAD_CALL, {}, f"invalid tool call: {OPEN} without {CLOSE}"))
        return found

    def defuse(self, text: str) -> str:
        return defuse(text, self.specials)

    def result_text(self, results: list[ToolResult]) -> str:
        """The text after the model's eos that answers `results`: rendered, never re-encoded."""
        if not results:
            return ""
        calling = [_USER, _calling_turn(len(results))]
        head = self.render(calling, generation=False)
        texts = [self.defuse(r.text) for r in results]
        full = self.render([*calling, *_tool_turns(texts)], generation=True)
        cut = head.rindex(self.eos) + len(self.eos)
        if not full.startswith(head[:cut]):  # checked at start; a result's text changed it
            raise GspoError(
                "the chat template is not prefix-preserving with these tool results "
                f"({_difference(head[:cut], full)}): {USE_CODE_BLOCK}"
            )
        return full[cut:]

    def result_ids(self, results: list[ToolResult]) -> list[int]:
        text = self.result_text(results)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def check_prefix_preserving(
    tokenizer: PreTrainedTokenizerBase,
    model_name: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """GspoError (one line naming `model_name`) unless the chat template renders tool turns,
    ends a calling turn with eos (then whitespace only), and renders the probe conversation at
    each length as a prefix of its rendering at the next."""
    where = f"the chat template of {model_name}"
    if not (
        getattr(tokenizer, "chat_template", None) or (template_kwargs or {}).get("chat_template")
    ):
        raise GspoError(f"{model_name} has no chat template, so no tool turns: {USE_CODE_BLOCK}")
    eos = tokenizer.eos_token
    if not eos:
        raise GspoError(f"{model_name} has no eos token to end a turn with: {USE_CODE_BLOCK}")
    render = _Renderer(tokenizer, template_kwargs)
    calling = [_USER, _calling_turn(1)]
    answered = [*calling, *_tool_turns([PROBE_RESULT])]
    try:
        lengths = [
            ("the question", render([_USER], generation=True)),
            ("the tool call", render(calling, generation=False)),
            ("the tool result", render(answered, generation=True)),
            ("the final answer", render([*answered, _FINAL], generation=False)),
        ]
    except Exception as exc:  # a template is user code (jinja): any failure means no tools
        raise GspoError(
            f"{where} cannot render tool turns ({_first_line(exc)}): {USE_CODE_BLOCK}"
        ) from None
    question, called, result = (text for _, text in lengths[:3])
    if PROBE_RESULT not in result:
        raise GspoError(f"{where} has no tool support (it drops tool messages): {USE_CODE_BLOCK}")
    for (_, shorter), (what, longer) in itertools.pairwise(lengths):
        if not longer.startswith(shorter):
            raise GspoError(
                f"{where} is not prefix-preserving with tool turns (adding {what} changes the "
                f"text before it, {_difference(shorter, longer)}): {USE_CODE_BLOCK}"
            )
    if PROBE_TOOL not in called[len(question) :]:
        raise GspoError(f"{where} does not render an assistant's tool calls: {USE_CODE_BLOCK}")
    if eos not in called or called.rpartition(eos)[2].strip():
        raise GspoError(
            f"{where} does not end a turn with a tool call with the eos token {eos!r}: "
            f"{USE_CODE_BLOCK}"
        )
