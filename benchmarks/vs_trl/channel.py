"""The parent's line to a side's process."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO


class Channel:
    """Commands from the parent on stdin; results to the parent on the original stdout (every
    other print of the process, C level included, goes to stderr)."""

    def __init__(self) -> None:
        self.out: TextIO = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **message: Any) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def wait(self) -> None:
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(0)
