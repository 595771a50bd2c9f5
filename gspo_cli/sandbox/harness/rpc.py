"""Calls from the trusted checker into the untrusted program, which runs in another process.

The checker holds `Remote` handles for the program's top-level names; calling one, reading an
attribute or indexing sends a request, and the program's process answers with tagged JSON
(wire.py). Lists, dicts and sets passed as arguments are copied back after each call, so checks
that look at an argument the program changed in place still work.
"""

from __future__ import annotations

from wire import WireError, decode, encode, receive, send, send_encoded

TYPE_CHECKING = False  # typing costs milliseconds at every start: annotations only
if TYPE_CHECKING:
    from typing import Any

MUTABLE = (list, dict, set)


class ProgramError(Exception):
    """The program failed while serving a call; `kind` is the verdict it maps to."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Peer:
    """The checker's end of the two pipes to the program's process."""

    def __init__(self, read_fd: int, write_fd: int, limit: int) -> None:
        self.read_fd, self.write_fd, self.limit = read_fd, write_fd, limit

    def receive(self) -> Any:
        """The program's next message, decoded to builtin values and handles."""
        try:
            raw = receive(self.read_fd, self.limit)
            if raw is None:
                raise ProgramError("runtime_error", "the program exited before answering")
            message = decode(raw, lambda ref: Remote(self, ref))
        except WireError as exc:
            raise ProgramError("runtime_error", f"unreadable answer: {exc}") from None
        if type(message) is not dict:
            raise ProgramError("runtime_error", "unreadable answer")
        if "error" in message:
            kind = message.get("kind")
            kind = kind if kind in ("memory_limit", "blocked") else "runtime_error"
            raise ProgramError(kind, str(message["error"])[:300])
        return message

    def request(self, op: str, ref: Any, *args: Any, **kwargs: Any) -> Any:
        def to_ref(value: Any) -> Any:
            if type(value) is Remote:
                return value._ref
            raise ProgramError("runtime_error", f"cannot pass a {type(value).__name__}")

        payload = {"op": op, "ref": ref, "args": list(args), "kwargs": kwargs}
        try:
            send(self.write_fd, payload, to_ref)
        except OSError:
            raise ProgramError("runtime_error", "the program exited before answering") from None
        answer = self.receive()
        back = answer.get("back")
        back = back if type(back) is dict else {}
        if type(back.get("args")) is list:
            for new, old in zip(back["args"], args, strict=False):
                _copy_back(new, old)
        if type(back.get("kwargs")) is dict:
            for name, new in back["kwargs"].items():
                if name in kwargs:
                    _copy_back(new, kwargs[name])
        return answer.get("ok")


def _copy_back(new: Any, old: Any) -> None:
    """Mirror an in-place change the program made to an argument (same container type only)."""
    if type(old) is list and type(new) is list:
        old[:] = new
    elif type(old) in (dict, set) and type(new) is type(old):
        old.clear()
        old.update(new)


class Remote:
    """A handle on an object in the program's process: call it, read attributes, index it."""

    __slots__ = ("_peer", "_ref")

    def __init__(self, peer: Peer, ref: Any) -> None:
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_ref", ref)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._peer.request("call", self._ref, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._peer.request("getattr", self._ref, name)

    def __getitem__(self, key: Any) -> Any:
        return self._peer.request("getitem", self._ref, key)

    def __bool__(self) -> bool:
        raise TypeError("an object of the program has no truth value here; return plain data")

    def __repr__(self) -> str:
        return f"<program object {self._ref!r}>"


def serve(namespace: dict[str, Any], read_fd: int, write_fd: int, limit: int, fail: Any) -> None:
    """The program's side: answer requests until the checker closes the pipe.

    `fail(exc)` maps an exception to (kind, message)."""
    table: list[Any] = []

    def to_ref(value: Any) -> int:
        table.append(value)
        return len(table) - 1

    def from_ref(ref: Any) -> Any:
        return namespace[ref] if type(ref) is str else table[ref]

    names = [n for n in namespace if not n.startswith("__")]
    send(write_fd, {"ok": names})
    while (raw := receive(read_fd, limit)) is not None:
        try:
            request = decode(raw, from_ref)
            target, args, kwargs = from_ref(request["ref"]), request["args"], request["kwargs"]
            if request["op"] == "call":
                result = target(*args, **kwargs)
            elif request["op"] == "getattr":
                result = getattr(target, args[0])
            else:
                result = target[args[0]]
            back = {
                "args": [a if type(a) in MUTABLE else None for a in args],
                "kwargs": {k: v for k, v in kwargs.items() if type(v) in MUTABLE},
            }
            answer = encode({"ok": result, "back": back}, to_ref)
        except BaseException as exc:  # the program's failure goes back as the answer
            kind, message = fail(exc)
            answer = encode({"error": message, "kind": kind}, to_ref)
        send_encoded(write_fd, answer)
