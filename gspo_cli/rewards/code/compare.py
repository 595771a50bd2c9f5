"""Output comparison as LiveCodeBench does it, plus a numeric tolerance for real numbers.

stdin/stdout: both texts are stripped, split into lines, and each line stripped; lines must be
equal exactly or, token by token, as numbers. Integers must be equal as numbers ("007" == "7");
a pair with a decimal point or exponent may differ by `tol`, absolute or relative, so that a
float checker never accepts a wrong 19-digit integer. Call-based outputs are compared as JSON.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation

NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
INTEGER = re.compile(r"[+-]?\d+")
DEFAULT_TOL = Decimal("1e-6")
MAX_NUMBER_LEN = 4096  # longer tokens are compared as text only: Decimal maths stays cheap


def stripped_lines(text: str) -> list[str]:
    """Lines of `text`, each stripped, without leading or trailing empty lines."""
    return [line.strip() for line in text.strip().split("\n")]


def numbers_close(got: str, want: str, tol: Decimal = DEFAULT_TOL) -> bool:
    """True when both tokens are finite numbers that agree (exactly, for two integers)."""
    if max(len(got), len(want)) > MAX_NUMBER_LEN:
        return False
    if not (NUMBER.fullmatch(got) and NUMBER.fullmatch(want)):
        return False
    try:
        a, b = Decimal(got), Decimal(want)
        if INTEGER.fullmatch(got) and INTEGER.fullmatch(want):
            return a == b
        return abs(a - b) <= tol * max(Decimal(1), abs(b))
    except (InvalidOperation, ArithmeticError):
        return False


def lines_match(got: str, want: str, tol: Decimal = DEFAULT_TOL) -> bool:
    """One output line against the expected one: exact first, then token-wise numbers."""
    if got == want:
        return True
    got_tokens, want_tokens = got.split(), want.split()
    if len(got_tokens) != len(want_tokens):
        return False
    return all(
        g == w or numbers_close(g, w, tol) for g, w in zip(got_tokens, want_tokens, strict=True)
    )


def compare_stdout(got: str, want: str, tol: Decimal = DEFAULT_TOL) -> bool:
    """True when a program's stdout matches the expected output."""
    got_lines, want_lines = stripped_lines(got), stripped_lines(want)
    if len(got_lines) != len(want_lines):
        return False
    return all(lines_match(g, w, tol) for g, w in zip(got_lines, want_lines, strict=True))


def compare_json(got: str, want: str) -> bool:
    """Call-based result against the expected JSON value (tuples were sent as lists)."""
    try:
        return bool(json.loads(got) == json.loads(want))
    except (ValueError, RecursionError):
        return got.strip() == want.strip()
