"""What a reward function must return, checked on every call.

A call on N completions returns N scores: a list (or tuple, or a 1-d array) of finite numbers
(float, int or bool). `None` is a score only where the recipe says what it means (`none_as`: a
number, or `skip`: the function does not score that completion). Anything else is a
`RewardFailure` whose message names the problem and the first bad index, never a traceback.

What a call is given: answers as text, unless the function declares that it takes others (a
list, a dict) with `takes_structured_answers` (or sets that attribute to True itself); data
with such answers is refused for a reward that reads `answer` without the declaration.
"""

from __future__ import annotations

import math
import numbers
import traceback
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

NoneAs = float | Literal["skip"] | None  # recipe: reward.functions[].none_as
MAX_MESSAGE = 200  # characters of an exception's message kept in the one-line error
STRUCTURED_ANSWERS = "takes_structured_answers"  # the attribute that declares it
OPTIONS_CHECK = "check_options_together"  # the attribute that holds a function's options check

F = TypeVar("F", bound=Callable[..., Any])


def takes_structured_answers(fn: F) -> F:
    """Decorator: `fn` reads answers that are not text (lists, dicts) and copes with them."""
    setattr(fn, STRUCTURED_ANSWERS, True)
    return fn


def declares_structured_answers(fn: Callable[..., Any]) -> bool:
    return getattr(fn, STRUCTURED_ANSWERS, False) is True


def options_checked_by(check: Callable[[dict[str, Any], NoneAs], None]) -> Callable[[F], F]:
    """Decorator: `check(options, none_as)` runs when the recipe loads, for what no single
    option's type can say (options that depend on one another; a None the entry must allow)."""

    def mark(fn: F) -> F:
        setattr(fn, OPTIONS_CHECK, check)
        return fn

    return mark


def check_options_together(
    fn: Callable[..., Any], options: dict[str, Any], none_as: NoneAs
) -> None:
    """Run `fn`'s declared options check, if any (ValueError with the one line)."""
    check = getattr(fn, OPTIONS_CHECK, None)
    if check is not None:
        check(options, none_as)


class RewardFailure(Exception):
    """One call of a reward function went wrong; the message says how (not which function)."""


class RewardTimeout(RewardFailure):
    """A call ran past its deadline."""


def checked_scores(result: Any, n: int, none_as: NoneAs) -> list[float | None]:
    """`result` as N floats (None: skipped), or RewardFailure naming the first problem."""
    if hasattr(result, "tolist") and not isinstance(result, list | tuple):
        result = result.tolist()  # a numpy array or a tensor: its Python numbers
    if not isinstance(result, list | tuple):
        raise RewardFailure(f"returned {_kind(result)}, not a list of {n} scores")
    if len(result) != n:
        count = f"{len(result)} score{'' if len(result) == 1 else 's'}"
        raise RewardFailure(f"returned {count} for {n} completions")
    return [_checked(i, score, none_as) for i, score in enumerate(result)]


def _checked(index: int, score: Any, none_as: NoneAs) -> float | None:
    if score is None:
        if none_as is None:
            raise RewardFailure(
                f"score {index} is None; to allow None, give this reward `none_as: 0.0` "
                "(or another number) or `none_as: skip` in the recipe"
            )
        return None if none_as == "skip" else float(none_as)
    if not isinstance(score, numbers.Real):  # bool and int are Real; str, complex are not
        raise RewardFailure(f"score {index} is {_kind(score)}, not a number (float, int or bool)")
    value = float(score)
    if not math.isfinite(value):
        raise RewardFailure(f"score {index} is {value}; scores must be finite")
    return value


def _kind(value: Any) -> str:
    """`None`, or a short `'abc' (str)` picture of a value for an error line."""
    if value is None:
        return "None"
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__})"


def describe_exception(exc: BaseException, home: str | None = None) -> str:
    """`raised TypeError: ... (at my_rewards.py:12)`: the exception's first line, and the
    deepest frame in the reward's own file `home` (else the deepest frame of all)."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if home is not None and f.filename == home]
    frame = (own or frames)[-1] if own or frames else None
    where = "" if frame is None else f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
    return f"raised {type(exc).__name__}{': ' + message if message else ''}{where}"


def parse_none_as(value: Any) -> NoneAs:
    """A recipe's `none_as`: None (unset), `skip`, or a finite number; ValueError otherwise."""
    if value is None or value == "skip":
        return typing.cast(NoneAs, value)
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number):
        raise ValueError(f"a finite number or skip (got {value!r})")
    return float(number)
