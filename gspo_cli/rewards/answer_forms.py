"""The answer-form rules, in one place: where a completion's final answer is, and in which form.

Strict accuracy (the maths reward) reads only the last `\\boxed{}`. To tell a model that learnt
to reason from one that learnt the box, every report also measures, from these rules:

- `answered`: the share of samples whose answer is in the expected form (maths: a last
  `\\boxed{}` with content; code: a fenced code block the judge would run);
- `accuracy_any_form`: correctness of the answer found in any form a grader would accept,
  checked by Math-Verify as `\\boxed{answer}` (`any_form_correct`).

`find_answer` looks, in this order, and the first form found wins:

1. `boxed`: the content of the last `\\boxed{}` (an empty box is no answer: the search goes on);
2. `marker`: the last "Answer: X", "The answer is X", "Final answer: X" (any case; "answer"
   must be followed by a colon or "is"). An explicit marker beats a bare number after it: a
   check after the answer sentence ("Answer: 42. Check: 6 x 7 = 42, 3 steps") does not
   replace it. X runs to the end of its line or sentence, without markdown bold, `$` and a
   final full stop; a number followed by words ("12 cm", "42 because ...") is the number;
3. `number`: the last number in the text: integers, decimals, fractions (3/4 and LaTeX
   `\\frac{3}{4}`), negatives, thousands separators (1,234 is 1234); a unit after it is fine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gspo_cli.rewards.code.extract import extract_code
from gspo_cli.rewards.extract import boxed, last_boxed
from gspo_cli.rewards.math_verifier import MathVerifierPool

BOXED, MARKER, NUMBER, CODE = "boxed", "marker", "number", "code"
# The form each kind of problem asks for (data/problems.py's `kind`).
EXPECTED_FORM = {"math": BOXED, "code": CODE}

# "answer" then ":" or "is": "the answer depends on" is not a marker, "Answer: 5" is.
_MARKER = re.compile(r"\b(?:final\s+answer|answer)\s*(?:\*\*)?\s*(?::|\bis\b)", re.IGNORECASE)
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-\u2212])?"  # a minus sign, unless it is a subtraction ("5-3")
    r"(?:\\d?frac\{\d+\}\{\d+\}"  # LaTeX \frac{3}{4}, \dfrac{3}{4}
    r"|(?<![\d.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?!\d)"  # 1,234.5 or 3/4
    r"|(?<![\d.])\.\d+(?!\d))"  # .5
)
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")
_EDGES = "*$ \t:"


@dataclass(frozen=True)
class FoundAnswer:
    """A completion's final answer and the form it was found in (BOXED, MARKER or NUMBER)."""

    text: str
    form: str


def _number_text(match: str) -> str:
    """A matched number as Math-Verify reads it: no thousands commas, an ASCII minus."""
    text = match.replace("\u2212", "-")
    return text if "frac" in text else text.replace(",", "")


def _marker_value(raw: str) -> str:
    """What follows an answer marker: its line or sentence, cleaned; a number before words
    ("12 cm", "42 because ...") is that number."""
    end = _SENTENCE_END.search(raw)
    value = (raw if end is None else raw[: end.start()]).strip(_EDGES).rstrip(".").strip(_EDGES)
    for wrapper in ("\\(", "\\["):
        value = value.removeprefix(wrapper)
    value = value.removesuffix("\\)").removesuffix("\\]").strip()
    lead = _NUMBER.match(value)
    if lead is not None and lead.end() < len(value):
        rest = value[lead.end() :]
        if rest[0].isspace() and (rest.lstrip()[:1].isalpha() or rest.lstrip()[:6] == "\\text{"):
            return _number_text(lead.group())
    return value


def find_answer(completion: str, truncated: bool = False) -> FoundAnswer | None:
    """The final answer in the first form found (see the module's rules), or None. A response
    cut at the token cap (`truncated`) has no final number: a grader reads a box or a marker
    in a cut response, never the last number it happened to reach."""
    content = last_boxed(completion)
    if content is not None and content.strip():
        return FoundAnswer(content.strip(), BOXED)
    for match in reversed(list(_MARKER.finditer(completion))):
        value = _marker_value(completion[match.end() :])
        if value:
            return FoundAnswer(value, MARKER)
    numbers = [] if truncated else _NUMBER.findall(completion)
    if numbers:
        return FoundAnswer(_number_text(numbers[-1]), NUMBER)
    return None


def answered(completion: str, expected_form: str) -> bool:
    """Whether `completion` holds its answer in `expected_form`: BOXED (a last `\\boxed{}` with
    content, what the strict reward reads), CODE (a code block the judge would run), MARKER or
    NUMBER (that form is present)."""
    if expected_form == CODE:
        return extract_code(completion) is not None
    if expected_form == BOXED:
        content = last_boxed(completion)
        return content is not None and bool(content.strip())
    if expected_form == MARKER:
        return any(_marker_value(completion[m.end() :]) for m in _MARKER.finditer(completion))
    if expected_form == NUMBER:
        return _NUMBER.search(completion) is not None
    raise ValueError(f"unknown answer form {expected_form!r}; known: {BOXED}, {MARKER}, "
                     f"{NUMBER}, {CODE}")  # fmt: skip


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def any_form_correct(
    completions: list[str],
    golds: list[str],
    strict: list[bool],
    pool: MathVerifierPool,
    truncated: list[bool] | None = None,
) -> list[bool]:
    """Whether each completion's answer, in any form, equals its gold answer (Math-Verify on
    `\\boxed{answer}`). `strict[i]`: the maths reward's verdict on completion i, reused where
    the answer found is that last box (the same check), so only other forms cost a check.
    `truncated[i]`: completion i was cut at the cap (no final-number answer: find_answer)."""
    cut = truncated or [False] * len(completions)
    found = [find_answer(c, t) for c, t in zip(completions, cut, strict=True)]
    out = [f is not None and f.form == BOXED and ok for f, ok in zip(found, strict, strict=True)]
    # An unbalanced brace would end the wrapping box early: that answer cannot be read.
    todo = [
        (i, f.text)
        for i, f in enumerate(found)
        if f is not None and f.form != BOXED and _balanced(f.text)
    ]
    if todo:
        wrapped = [boxed(text) for _, text in todo]
        scores = pool.score(wrapped, [str(golds[i]) for i, _ in todo])
        for (i, _), score in zip(todo, scores, strict=True):
            out[i] = score >= 1.0
    return out
