"""The session mode's program side: one live interpreter that runs the cells it is sent, one at a
time, in one namespace, as a notebook's kernel does.

Cells arrive as tagged JSON {"n": N, "code": SOURCE} (wire.py) on the descriptor that was the
sandbox's stdin; the program's own stdin is then /dev/null, so `input()` cannot read the next
cell. A cell's output goes straight to the sandbox's stdout and stderr (flushed at its end),
and one answer follows on the reply descriptor: {"n": N, "error": None} or {"n": N, "error":
"ZeroDivisionError: ...", "kind": KIND}. A cell whose last statement is an expression prints its
value's repr. A process a cell forks never reads a cell nor answers one: both descriptors are
closed in it, and one that returns into this loop exits.

Only the caller ends a session: it closes the cell pipe, or kills the sandbox at a deadline. A
cell that ends the process (os._exit, a signal, the memory cgroup) ends the session without an
answer; the checker then reports how the process ended, and the caller says so.
"""

from __future__ import annotations

import ast
import builtins
import os
import sys

from wire import decode, receive, send

TYPE_CHECKING = False  # typing costs milliseconds at every start: annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def take_stdin() -> int:
    """The cell pipe (the sandbox's stdin) on a descriptor of its own; stdin reads /dev/null."""
    cells = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return cells


def run_cell(source: str, namespace: dict[str, Any]) -> None:
    """Run one cell; its last expression's value (if not None) is printed as its repr."""
    tree = ast.parse(source, "<cell>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def serve(
    cell_fd: int, reply_fd: int, limit: int, fail: Callable[[BaseException], tuple[str, str]]
) -> None:
    """Answer cells until the caller closes the pipe. `fail(exc)`: an escaping exception's
    (kind, message), its traceback on stderr."""
    owner = os.getpid()

    def forked() -> None:  # a cell's child: the session's pipes are not its own
        for fd in (cell_fd, reply_fd):
            try:  # noqa: SIM105 (contextlib: milliseconds at every start)
                os.close(fd)
            except OSError:
                pass

    os.register_at_fork(after_in_child=forked)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    while (raw := receive(cell_fd, limit)) is not None:
        cell = decode(raw, lambda ref: None)
        answer: dict[str, Any] = {"n": cell["n"], "error": None}
        try:
            run_cell(cell["code"], namespace)
        except BaseException as exc:  # SystemExit too: the session lives on
            kind, message = fail(exc)
            answer.update(error=message, kind=kind)
        if os.getpid() != owner:  # a fork's child came back from the cell
            os._exit(0)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:  # noqa: SIM105 (contextlib: milliseconds at every start)
                stream.flush()  # type: ignore[union-attr]
            except BaseException:  # a cell that closed or replaced it: its own loss
                pass
        send(reply_fd, answer)
