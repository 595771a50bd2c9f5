"""A judge's template and parse rule: what it is asked, and how a number is read back.

Pointwise templates hold `{prompt}` and `{completion}`; group templates (`mode: group`, one call
for a prompt's G responses, ART's RULER) hold `{prompt}` and `{completions}` (the responses
numbered 1..G). Placeholders are replaced as plain text, so other braces (a JSON example) stay.
A parse rule is a regex with one group (a number: pointwise the last match, in group mode every
match in order) or
`json:FIELD` (the reply's JSON object's FIELD: a number, or in group mode a list of numbers or
of objects with a `score`). A value outside `score_range` is a parse failure too; values inside
map linearly onto [0, 1].
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["pointwise", "group"]
PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "pointwise": ("{prompt}", "{completion}"),
    "group": ("{prompt}", "{completions}"),
}
DEFAULT_TEMPLATES: dict[str, str] = {
    "pointwise": (
        "Rate how well the response answers the question, from 0 (useless) to 10 (perfect).\n\n"
        "Question:\n{prompt}\n\nResponse:\n{completion}\n\n"
        "Reply with one line: Score: <number>"
    ),
    "group": (
        "Here is a question and several responses to it. Score each response from 0 (useless) "
        "to 10 (the best possible), comparing them with one another.\n\n"
        "Question:\n{prompt}\n\nResponses:\n{completions}\n\n"
        'Reply with JSON only: {"scores": [one number per response, in order]}'
    ),
}
DEFAULT_PARSE: dict[str, str] = {
    "pointwise": r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)",
    "group": "json:scores",
}
JSON_PREFIX = "json:"


class ParseFailure(Exception):
    """The reply holds no usable score; the message says why."""


def check_template(template: str, mode: str) -> str:
    """`template` when it holds its mode's placeholders; ValueError naming the missing one."""
    missing = [p for p in PLACEHOLDERS[mode] if p not in template]
    if missing:
        raise ValueError(
            f"the {mode} judge template lacks {' and '.join(missing)} "
            f"(a {mode} template holds {' and '.join(PLACEHOLDERS[mode])})"
        )
    return template


def check_parse(rule: str) -> str:
    """`rule` when it is `json:FIELD` or a regex with exactly one group; ValueError otherwise."""
    if rule.startswith(JSON_PREFIX):
        if not rule[len(JSON_PREFIX) :].strip():
            raise ValueError("parse json:FIELD needs a field name")
        return rule
    try:
        groups = re.compile(rule).groups
    except re.error as exc:
        raise ValueError(f"parse {rule!r} is not a regex: {exc}") from None
    if groups != 1:
        raise ValueError(f"parse {rule!r} has {groups} groups; it needs one (the number)")
    return rule


def render(template: str, prompt: str, completions: list[str], mode: str) -> str:
    """The text a judge is asked: the template with its placeholders filled."""
    text = template.replace("{prompt}", prompt)
    if mode == "group":
        listed = "\n\n".join(f"[{i}] {c}" for i, c in enumerate(completions, start=1))
        return text.replace("{completions}", listed)
    return text.replace("{completion}", completions[0])


@dataclass(frozen=True)
class ScoreReader:
    """Reads a reply's scores by the parse rule and maps them onto [0, 1]."""

    rule: str
    low: float
    high: float

    def read(self, reply: str, count: int) -> list[float]:
        """`count` scores in [0, 1] (1 pointwise, G in a group); ParseFailure otherwise."""
        if self.rule.startswith(JSON_PREFIX):
            raw = self._json(reply)
        else:  # pointwise: the last match (a judge may restate its scale before its verdict)
            raw = re.findall(self.rule, reply)
            raw = raw[-1:] if count == 1 else raw
        if len(raw) != count:
            raise ParseFailure(f"found {len(raw)} score(s) for {count} response(s)")
        return [self._mapped(value) for value in raw]

    def _json(self, reply: str) -> list[Any]:
        field = self.rule[len(JSON_PREFIX) :].strip()
        obj = _json_object(reply)
        if field not in obj:
            raise ParseFailure(f"the reply's JSON has no {field!r}")
        value = obj[field]
        if not isinstance(value, list):
            return [value]
        return [v.get("score") if isinstance(v, dict) else v for v in value]

    def _mapped(self, value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ParseFailure(f"{str(value)[:40]!r} is not a number") from None
        if isinstance(value, bool) or not math.isfinite(number):
            raise ParseFailure(f"{value!r} is not a finite number")
        if not self.low <= number <= self.high:
            raise ParseFailure(f"{number:g} is outside score_range [{self.low:g}, {self.high:g}]")
        return (number - self.low) / (self.high - self.low)


def _json_object(reply: str) -> dict[str, Any]:
    """The reply as a JSON object, or the outermost {...} inside it (a model's chatter)."""
    text = reply.strip()
    candidates = [text]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ParseFailure("the reply holds no JSON object")
