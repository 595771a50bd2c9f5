"""`rollout.tools` as plain values: what the rollout engine's tool use needs from a recipe.

Below recipe/ and rollout/ (both use it), so that a recipe names it without importing the
rollout engines (docs/tools.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Side = Literal["head", "tail"]  # which part of a long tool output is kept


@dataclass(frozen=True)
class ToolSettings:
    """`rollout.tools` as plain values (the recipe's section converts itself to this). The
    defaults here are the one copy: the recipe's `rollout.tools` fields take theirs from them."""

    format: Literal["code_block", "chat_template"] = "code_block"
    interpreter: Literal["python"] | None = "python"
    functions: tuple[str, ...] = ()  # import paths "module:function" (TRL's `tools=`)
    environment: str | None = None  # import path "module:Class" (TRL's `environment_factory=`)
    openenv: str | None = None  # an OpenEnv server: "module:app" (started here) or a URL
    max_calls: int = 4  # per trajectory; 0 = no call is ever run
    output_max_tokens: int = 64  # a result's content is cut to this many tokens ...
    output_truncation: Side = "tail"  # ... keeping its head or its tail
    timeout_s: float = 5.0  # one call's deadline (the interpreter's sandbox, a user tool)
    memory_mb: int = 512  # the interpreter session's memory limit
    output_max_bytes: int = 64 * 1024  # the interpreter's stdout cap per call
    allow_weak_isolation: bool = False  # the interpreter may run under a weak sandbox mode
