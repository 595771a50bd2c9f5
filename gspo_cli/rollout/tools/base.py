"""What a tool-using rollout is made of: the settings, a call, its result, and the two roles a
tool setup plays (a *format*: how calls appear in the model's text and how results are written
back as tokens; a *toolbox*: what runs the calls of one trajectory).

Token in, token out (docs/tools.md): the model's tokens are the engine's ids, never re-encoded;
an environment's tokens are tokenised once, when they are appended, and marked as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gspo_cli.rollout.tool_settings import Side, ToolSettings

__all__ = ["Side", "ToolCall", "ToolFormat", "ToolResult", "ToolSettings", "Toolbox"]
__all__ += ["cut_output", "defuse", "special_strings"]

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


def cut_output(
    text: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int, side: Side
) -> tuple[str, bool]:
    """`text` cut to `max_tokens` tokens (its head or its tail) with a marker saying so, and
    whether it was cut. The cut text is tokenised again inside its block: that is the one time
    the environment's tokens are made."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text, False
    kept = ids[:max_tokens] if side == "head" else ids[-max_tokens:]
    body = tokenizer.decode(kept, skip_special_tokens=True)
    dropped = len(ids) - max_tokens
    return (f"{body}\n[... {dropped} tokens cut]" if side == "head" else
            f"[{dropped} tokens cut ...]\n{body}"), True  # fmt: skip


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
