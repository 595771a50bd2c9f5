"""Output comparison as LiveCodeBench does it, plus a numeric tolerance for real numbers.

stdin/stdout: both texts are stripped, split into lines, and each line stripped; lines must be
equal exactly or, token by token, as numbers. Where the expected token is an integer, only an
integer equal to it counts ("007" == "7", but never "998244000.0" for "998244353"); where it
has a decimal point or exponent, the answer may differ by `tol`, absolute or relative.
Call-based outputs are compared as JSON.

A program's output is never split into a list of lines or tokens: line counts are compared
first, and lines and tokens are then walked one at a time, so a flood of short lines costs the
trainer no more memory than the output itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation

NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
TOKEN = re.compile(r"\S+")
INTEGER = re.compile(r"[+-]?\d+")
DEFAULT_TOL = Decimal("1e-6")
MAX_NUMBER_LEN = 4096  # longer tokens are compared as text only: Decimal maths stays cheap


def stripped_lines(text: str) -> Iterator[str]:
    """Lines of `text`, each stripped, without leading or trailing empty lines (lazily)."""
    return _lines(text.strip())


def _lines(text: str) -> Iterator[str]:
    start = 0
    while (end := text.find("\n", start)) >= 0:
        yield text[start:end].strip()
        start = end + 1
    yield text[start:].strip()


def numbers_close(got: str, want: str, tol: Decimal = DEFAULT_TOL) -> bool:
    """True when both tokens are finite numbers that agree: exactly, when `want` is an integer
    (then `got` must be an integer too), else within `tol`."""
    if max(len(got), len(want)) > MAX_NUMBER_LEN:
        return False
    if not (NUMBER.fullmatch(got) and NUMBER.fullmatch(want)):
        return False
    try:
        a, b = Decimal(got), Decimal(want)
        if INTEGER.fullmatch(want):
            return INTEGER.fullmatch(got) is not None and a == b
        return abs(a - b) <= tol * max(Decimal(1), abs(b))
    except (InvalidOperation, ArithmeticError):
        return False


def lines_match(got: str, want: str, tol: Decimal = DEFAULT_TOL) -> bool:
    """One output line against the expected one: exact first, then token-wise numbers."""
    if got == want:
        return True
    got_tokens, want_tokens = TOKEN.finditer(got), TOKEN.finditer(want)
    for w in want_tokens:
        g = next(got_tokens, None)
        if g is None or not (g[0] == w[0] or numbers_close(g[0], w[0], tol)):
            return False
    return next(got_tokens, None) is None


def compare_stdout(got: str, want: str, tol: Decimal = DEFAULT_TOL) -> bool:
    """True when a program's stdout matches the expected output."""
    got, want = got.strip(), want.strip()
    if got.count("\n") != want.count("\n"):
        return False  # before any splitting: a flood of lines is rejected in one pass
    return all(lines_match(g, w, tol) for g, w in zip(_lines(got), _lines(want), strict=True))


def compare_json(got: str, want: str) -> bool:
    """Call-based result against the expected JSON value (tuples were sent as lists)."""
    try:
        return bool(json.loads(got) == json.loads(want))
    except (ValueError, RecursionError):
        return got.strip() == want.strip()
