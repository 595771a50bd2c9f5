"""How to make a folder a recipe names but that is not there yet, as the recipe's own comments
say: a shipped recipe whose teacher is another run's output says, in a comment, the `gspo`
command that makes it (`... --out runs/X`); the refusal quotes that command."""

from __future__ import annotations

import re
from pathlib import Path

_OUT = re.compile(r"--out\s+(\S+)")
_BASE = re.compile(r"^base:\s*[\"']?([^\"'#\s]+)", re.MULTILINE)


def _commands(text: str) -> list[str]:
    """The `gspo ...` commands in the comment lines of `text` (a trailing backslash joins the
    next comment line), each as one line."""
    commands: list[str] = []
    pending: str | None = None
    for line in text.splitlines():
        comment = line.strip()
        if not comment.startswith("#"):
            pending = None
            continue
        body = comment.lstrip("#").strip()
        if pending is not None:
            body = f"{pending} {body}"
        elif not body.startswith("gspo "):
            continue
        if body.endswith("\\"):
            pending = body.rstrip("\\").strip()
            continue
        pending = None
        commands.append(body)
    return commands


def made_by(recipe_file: Path, missing: Path, depth: int = 0) -> str | None:
    """The command in `recipe_file`'s comments (or its `base:` recipes') whose `--out` folder
    is `missing` or holds it, or None."""
    try:
        text = recipe_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    wanted = missing.as_posix().rstrip("/") + "/"
    for command in _commands(text):
        out = _OUT.search(command)
        if out is None:
            continue
        folder = Path(out.group(1)).as_posix().strip("/").removeprefix("./")
        if f"/{folder}/" in f"/{wanted}":
            return command
    base = _BASE.search(text)
    if base is None or depth >= 8:  # a bound: the loader has refused a loop already
        return None
    return made_by(recipe_file.parent / base.group(1), missing, depth + 1)
