"""Pull the program out of a completion: the last fenced code block, python-tagged first."""

from __future__ import annotations

import re

# An opening fence may carry a language tag (```python, ```py3, ```Python); a closing one not.
FENCE = re.compile(r"^\s*```\s*([\w+#.-]*)[^\n`]*$")
PYTHON_TAGS = frozenset({"python", "python3", "py", "py3", "pypy", "pypy3"})


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every closed fenced block as (lower-cased tag, body), in order; unclosed ones dropped."""
    blocks: list[tuple[str, str]] = []
    tag: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        match = FENCE.match(line)
        if tag is None:
            if match:
                tag, body = match.group(1).lower(), []
        elif line.strip() == "```":
            blocks.append((tag, "\n".join(body)))
            tag = None
        else:
            body.append(line)
    return blocks


def extract_code(completion: str) -> str | None:
    """The last python-tagged block, else the last untagged one, else None.

    Blocks tagged with another language (```cpp, ```text) are never run as Python.
    """
    blocks = code_blocks(completion)
    for wanted in (lambda t: t in PYTHON_TAGS, lambda t: t == ""):
        chosen = [body for tag, body in blocks if wanted(tag)]
        if chosen and chosen[-1].strip():
            return chosen[-1]
    return None
