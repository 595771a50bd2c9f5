"""Values between the trusted checker and the untrusted program: plain data or opaque handles.

A value crosses as tagged JSON: None, bool, int, float, str and list as themselves; tuple, set,
frozenset, dict, bytes and complex as {"t": tag, "v": ...}; anything else as {"t": "ref", "v": id}
(a handle the other side can only call, index or read attributes of). The checker decodes
whatever the program sends into builtin values only, so an answer can never bring its own
__eq__; a handle compares by identity and has no truth value.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing costs milliseconds at every start: annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_DEPTH = 200
PLAIN = (type(None), bool, int, float, str)
CONTAINERS: dict[type, str] = {tuple: "tuple", set: "set", frozenset: "frozenset"}
BUILD: dict[str, Callable[[Any], Any]] = {"tuple": tuple, "set": set, "frozenset": frozenset}
# A subclass of a builtin type crosses as its builtin value (its own methods stay behind).
COERCE: dict[type, Callable[[Any], Any]] = {
    int: int.__int__, float: float.__float__, str: str.__str__, bytes: bytes,
    complex: complex, list: list, tuple: tuple, dict: dict, set: set, frozenset: frozenset,
}  # fmt: skip
SUBCLASSABLE = tuple(COERCE)


class WireError(ValueError):
    """A message that is not well-formed tagged JSON (or too big)."""


def _no_refs(value: Any) -> Any:
    raise WireError(f"cannot send a {type(value).__name__}")


def encode(value: Any, to_ref: Callable[[Any], Any], depth: int = 0) -> Any:
    """`value` as JSON-ready data; non-plain objects become handles through `to_ref`."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    kind = type(value)
    if kind not in PLAIN and isinstance(value, SUBCLASSABLE):  # e.g. IntEnum, namedtuple
        base = next(b for b in SUBCLASSABLE if isinstance(value, b))
        value, kind = COERCE[base](value), base
    if kind in PLAIN:
        return value
    if kind is list:
        return [encode(v, to_ref, depth + 1) for v in value]
    if kind in CONTAINERS:
        return {"t": CONTAINERS[kind], "v": [encode(v, to_ref, depth + 1) for v in value]}
    if kind is dict:
        items = [
            [encode(k, to_ref, depth + 1), encode(v, to_ref, depth + 1)] for k, v in value.items()
        ]
        return {"t": "dict", "v": items}
    if kind is bytes:
        return {"t": "bytes", "v": value.decode("latin-1")}
    if kind is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    return {"t": "ref", "v": to_ref(value)}


def decode(text: str | bytes, from_ref: Callable[[Any], Any]) -> Any:
    """Builtin values (and handles made by `from_ref`) from `encode`'s JSON; WireError else."""

    def untag(obj: dict[str, Any]) -> Any:
        if obj.keys() != {"t", "v"}:
            raise WireError("unexpected object")
        tag, raw = obj["t"], obj["v"]
        if tag in BUILD and type(raw) is list:
            return BUILD[tag](raw)
        if (
            tag == "dict"
            and type(raw) is list
            and all(type(p) is list and len(p) == 2 for p in raw)
        ):
            return dict(raw)
        if tag == "bytes" and type(raw) is str:
            return raw.encode("latin-1")
        if tag == "complex" and type(raw) is list and len(raw) == 2:
            return complex(*raw)
        if tag == "ref" and type(raw) in (int, str):
            return from_ref(raw)
        raise WireError(f"unknown tag {tag!r}")

    try:
        return json.loads(text, object_hook=untag)
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:
        raise WireError(f"malformed value ({type(exc).__name__})") from None


def send(fd: int, message: Any, to_ref: Callable[[Any], Any] = _no_refs) -> None:
    """One message (encoded as above), length-prefixed."""
    send_encoded(fd, encode(message, to_ref))


def send_encoded(fd: int, encoded: Any) -> None:
    data = json.dumps(encoded).encode()
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data) :]


def receive(fd: int, limit: int) -> bytes | None:
    """The next message's bytes; None at end of stream. WireError above `limit` bytes."""
    head = _read_exact(fd, 8)
    if head is None:
        return None
    size = int.from_bytes(head, "little")
    if size > limit:
        raise WireError(f"message of {size} bytes exceeds {limit}")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return body


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
