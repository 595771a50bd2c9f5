"""What a tool-using rollout is made of: the settings, a call, its result, and the two roles a
tool setup plays (a *format*: how calls appear in the model's text and how results are written
back as tokens; a *toolbox*: what runs the calls of one trajectory).

Token in, token out (docs/tools.md): the model's tokens are the engine's ids, never re-encoded;
an environment's tokens are tokenised once, when they are appended, and marked as such.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gspo_cli.rollout.tool_settings import Side, ToolSettings

__all__ = ["Side", "ToolCall", "ToolFormat", "ToolResult", "ToolSettings", "Toolbox"]
__all__ += ["cap_text", "cut_output", "defuse", "result_text", "special_strings"]

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote. `error` is set when the call could not be understood (bad
    JSON, an unknown tool): it is answered with the error and counted, never run."""

    name: str  # "python" for the interpreter
    arguments: dict[str, Any]  # {"code": ...} for the interpreter
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model is shown (already cut to output_max_tokens)
    error: bool  # the call failed: an exception, a non-zero exit, a timeout, a bad call
    seconds: float  # wall time of the call
    cut: bool = False  # the output was longer than output_max_tokens
    restarted: bool = False  # the call ended the interpreter's session (a fresh one follows)


class ToolFormat(Protocol):
    """How calls appear in the model's text and how results become environment tokens."""

    @property
    def stop(self) -> re.Pattern[str] | None:
        """A model turn ends where its response text first matches (a complete call); None:
        at end-of-turn only (chat templates: the call is in the finished turn)."""
        ...

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Where an engine that knows only literal stop strings may end a turn early."""
        ...

    def calls(self, turn_text: str, ended: bool) -> list[ToolCall]:
        """The calls in one model turn (`ended`: it ended with end-of-turn); [] = no call, the
        trajectory is over if the turn ended."""
        ...

    def result_ids(self, results: list[ToolResult]) -> list[int]:
        """The environment tokens that answer a turn's calls, tokenised once."""
        ...


class Toolbox(Protocol):
    """Runs the calls of one trajectory; one instance per trajectory, kept for its life."""

    def run(self, calls: list[ToolCall]) -> list[ToolResult]: ...

    def reward(self) -> float | None:
        """An environment's own reward for the trajectory (`get_reward()`), else None."""
        ...

    def close(self) -> None: ...


# A user tool's text is cut to max_tokens x this many characters before it is tokenised: more
# than the tokens shown need (BPE tokens average ~4 characters; whitespace runs are the longest).
MAX_CHARS_PER_TOKEN = 32


def result_text(value: Any) -> str:
    """What the model is shown of a return value: JSON for dicts and lists, str() otherwise."""
    if isinstance(value, dict | list):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):  # circular, or keys JSON cannot hold
            return str(value)
    return str(value)


def cap_text(text: str, max_chars: int, side: Side) -> tuple[str, int]:
    """`text` cut to `max_chars` characters (its head or its tail), and how many were cut: a
    huge result is cut before it is tokenised."""
    if len(text) <= max_chars:
        return text, 0
    kept = text[:max_chars] if side == "head" else text[len(text) - max_chars :]
    return kept, len(text) - max_chars


def cut_output(
    text: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int, side: Side, dropped: int = 0
) -> tuple[str, bool]:
    """`text` cut to `max_tokens` tokens (its head or its tail) with a marker saying so, and
    whether it was cut. The cut text is tokenised again inside its block: that is the one time
    the environment's tokens are made. `dropped`: characters already cut from `text` on that
    side (cap_text); the marker then counts characters. Special strings are defused first, so
    the bound holds for what is appended (a defused `<|im_end|>` is several tokens)."""
    text = defuse(text, special_strings(tokenizer))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens and not dropped:
        return text, False
    kept = ids[:max_tokens] if side == "head" else ids[-max_tokens:]
    body = tokenizer.decode(kept, skip_special_tokens=True)
    cut = f"{len(ids) - max_tokens} tokens"
    if dropped:
        cut = f"{dropped + max(0, len(text) - len(body))} characters"
    return (f"{body}\n[... {cut} cut]" if side == "head" else
            f"[{cut} cut ...]\n{body}"), True  # fmt: skip


def special_strings(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The strings `tokenizer` reads as special tokens, longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", {}).values()
    found = {*tokenizer.all_special_tokens, *(t.content for t in added if t.special)} - {""}
    return sorted(found, key=len, reverse=True)


def defuse(text: str, specials: list[str]) -> str:
    """`text` with every special token's string broken by a space ("<|im_end|>" ->
    "< |im_end|>"): a tool's output, tokenised, must not end or open a turn."""
    for special in specials:
        if special in text:
            text = text.replace(special, f"{special[0]} {special[1:]}")
    return text
