"""TRL's dataset formats made into the rows training reads: `clean_rows`.

- `prompt` is a string (TRL's standard format) or a list of {role, content} messages (its
  conversational format). Roles are TRL's: system, user, assistant, tool; every turn needs a
  role and text content. Keys the file leaves empty in a turn (Arrow fills a key missing from
  one turn with null) are dropped, other keys (`name`, ...) go to the chat template.
- A conversation whose last turn is the assistant's (a `messages` column, data.prompt_column:
  messages) is split: the turns before it are the prompt, and that turn's content is the row's
  cold-start target, `solution` (replacing a `solution` column, if any). A conversation that
  ends otherwise is prompt-only. TRL's continuation of a final assistant message is not
  supported: that turn is always the target.
- `answer`: text is kept; an int or float becomes text (str(), 42.0 -> "42": maths data in
  JSON, and CSV columns that pandas made floats); null (or NaN) drops the row, unless the row
  has `tests` (a code problem, judged by its tests), and `clean_rows` returns how many it
  dropped; anything else (list, dict, bool) is refused, unless no reward that reads `answer`
  takes text only (rewards declare it: rewards.contract.takes_structured_answers).

Rows are numbered from 0 in errors, in source order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gspo_cli.core.errors import GspoError

ROLES = ("system", "user", "assistant", "tool")
SOLUTION_KEY = "solution"  # the cold-start target: a column, or a conversation's last turn


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({type(value).__name__})"


def _turn(value: Any, index: int) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"turn {index} is {_kind(value)}, not a {{role, content}} message")
    role, content = value.get("role"), value.get("content")
    if role is None:
        raise ValueError(f"turn {index} has no role")
    if role not in ROLES:
        raise ValueError(f"turn {index} has role {role!r}; known: {', '.join(ROLES)}")
    if content is None:
        raise ValueError(f"turn {index} ({role}) has no content")
    if not isinstance(content, str):
        raise ValueError(f"turn {index} ({role}): content is {_kind(content)}, not text")
    return {key: v for key, v in value.items() if v is not None}


def split_conversation(value: Any) -> tuple[str | list[dict[str, Any]], str | None]:
    """(prompt, target or None) of a `prompt` value; ValueError naming what is wrong."""
    if isinstance(value, str):
        return value, None
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise ValueError(f"prompt is {_kind(value)}: neither text nor a list of messages")
    turns = [_turn(turn, i) for i, turn in enumerate(value)]
    target = turns.pop()["content"] if turns and turns[-1]["role"] == "assistant" else None
    if not turns:
        raise ValueError("the conversation has no turn before the assistant's answer")
    return turns, target


def answer_text(value: Any, structured: bool) -> Any:
    """The answer as kept (module docstring): None means the row has none."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if structured:
        return value
    raise ValueError(f"answer {_kind(value)} is not text")


def clean_rows(
    rows: list[dict[str, Any]], where: str, text_only: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], int]:
    """(rows as training reads them, how many were dropped for a null answer).

    `text_only` names the rewards that read `answer` and take text only: with any, a list or
    dict answer is refused. GspoError names the source `where`, the row and the problem."""
    kept: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        try:
            prompt, target = split_conversation(row.get("prompt"))
        except ValueError as exc:
            raise GspoError(f"data: {where} row {i}: {exc}") from None
        try:
            answer = answer_text(row.get("answer"), structured=not text_only)
        except ValueError as exc:
            raise GspoError(
                f"data: {where} row {i}: {exc}, and reward {', '.join(text_only)} reads answers "
                "as text: make it text, or declare a reward that takes it with "
                "takes_structured_answers (gspo_cli.rewards.contract)"
            ) from None
        if answer is None and row.get("tests") is None:
            continue
        clean = {**row, "prompt": prompt, "answer": answer}
        if target is not None:
            clean[SOLUTION_KEY] = target
        kept.append(clean)
    if rows and not kept:
        raise GspoError(f"data: no row of {where} has an answer (all null, and no tests)")
    return kept, len(rows) - len(kept)
