"""Pull the final answer out of a completion: the content of its last \\boxed{...}."""

from __future__ import annotations

BOXED = "\\boxed"


def boxed(answer: str) -> str:
    """`answer` in the form the maths rewards read: `\\boxed{answer}`."""
    return f"{BOXED}{{{answer}}}"


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces balanced), or None if there is none."""
    start = text.rfind(BOXED + "{")
    while start != -1:
        depth, i = 0, start + len(BOXED)
        for i in range(start + len(BOXED), len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len(BOXED) + 1 : i]
        start = text.rfind(BOXED + "{", 0, start)  # unbalanced: try an earlier one
    return None
