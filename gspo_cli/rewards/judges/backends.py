"""Who answers a judge's question: a built-in rule, an OpenAI-compatible server, a local LM.

- `builtin:overlap`: the F1 of the completion's and the reference answer's words (lower-cased
  runs of letters and digits, counted as multisets, as SQuAD's F1); no answer: an error.
- `builtin:length`: min(1, words / 100): a judge that prefers longer answers, the verbosity bias
  of real judges made explicit (a reward to hack, beside an honest held-out judge).
  Built-in judges score directly in [0, 1]: no template, no parse, the same in both modes.
- `http(s)://host:port/v1`: POST {url}/chat/completions (one user message, temperature 0); the
  reply is `choices[0].message.content`. `timeout_s` bounds the whole call, however slowly
  the server answers.
- any other value: a causal LM checkpoint (a folder or hub id) that generates its judgement
  greedily, `max_new_tokens` at most, through its chat template when it has one; loaded once
  per process and device.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import threading
import urllib.parse
import urllib.request
from collections import Counter
from typing import Any

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("overlap", "length")
LENGTH_WORDS = 100  # builtin:length's score reaches 1 at this many words
URL_PREFIXES = ("http://", "https://")
MAX_ANSWER_BYTES = 4 * 1024**2  # a judge's answer is a short text; more is a broken server
WORD = re.compile(r"[a-z0-9]+")

_LOADED: dict[tuple[str, str], tuple[Any, Any]] = {}  # (path, device) -> (model, tokenizer)
_LOAD_LOCK = threading.Lock()


class JudgeError(Exception):
    """A judge call failed (refused, timed out, a broken answer); the message says how."""


def check_judge_model(model: str) -> str:
    """`model` when it names a built-in, a URL or a loadable causal LM; ValueError otherwise."""
    if model.startswith(BUILTIN_PREFIX):
        if model[len(BUILTIN_PREFIX) :] not in BUILTINS:
            known = ", ".join(BUILTIN_PREFIX + b for b in BUILTINS)
            raise ValueError(f"unknown built-in judge {model!r}; known: {known}")
        return model
    if model.startswith(URL_PREFIXES):
        if not re.match(r"https?://[^/\s:]+(:\d+)?(/\S*)?$", model):
            raise ValueError(f"judge URL {model!r} is not http(s)://host[:port]/path")
        return model
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"cannot load a judge model from {model!r}: {first}") from None
    return model


def builtin_score(name: str, completion: str, answer: Any) -> float:
    """A built-in judge's score in [0, 1] (see the module's docstring)."""
    words = WORD.findall(completion.lower())
    if name == "length":
        return min(1.0, len(words) / LENGTH_WORDS)
    if answer is None:
        raise JudgeError("builtin:overlap needs the reference answer column, which is empty")
    gold = WORD.findall(str(answer).lower())
    common = sum((Counter(words) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(words), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """The connection for `url` and the path to request on it, through the environment's
    proxy (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) as urllib would take it."""
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname or "", parts.port
    except ValueError:  # a port out of range
        raise JudgeError(f"bad URL {url!r}") from None
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return kind(host, port, timeout=timeout_s), path
    via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme == "https":  # a tunnel through the proxy, TLS end to end
        conn = kind(via.hostname or "", via.port, timeout=timeout_s)
        conn.set_tunnel(host, port)
        return conn, path
    return http.client.HTTPConnection(via.hostname or "", via.port, timeout=timeout_s), url


def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> bytes:
    """POST `body` to `url`; the answer's body. One deadline for the whole call: a timer
    shuts the socket down at `timeout_s`, so a server that trickles its answer a byte at a
    time is cut there too (a per-read timeout would wait for ever)."""
    conn, path = _connection(url, timeout_s)
    expired = threading.Event()
    sockets: list[socket.socket] = []  # the connected socket (the response keeps using it
    # after the connection object lets go of it)

    def cut() -> None:
        expired.set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout_s, cut)
    timer.start()
    try:
        conn.connect()  # bounded by the socket timeout, timeout_s
        sockets.append(conn.sock)
        if expired.is_set():  # the timer fired before the socket was there to cut
            raise TimeoutError
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        payload = response.read(MAX_ANSWER_BYTES + 1)
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise JudgeError(f"no answer within timeout_s {timeout_s:g}s") from None
        if isinstance(exc, ConnectionRefusedError | socket.gaierror):
            raise JudgeError(f"cannot reach it ({exc})") from None
        raise JudgeError(f"connection failed ({exc})") from None
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():  # cut while the body was read: what came is not the whole answer
        raise JudgeError(f"no answer within timeout_s {timeout_s:g}s")
    if response.status >= 300:  # a redirect is not followed: a POST must not be re-sent
        raise JudgeError(f"HTTP {response.status} {response.reason}")
    if len(payload) > MAX_ANSWER_BYTES:
        raise JudgeError(f"an answer over {MAX_ANSWER_BYTES // 1024**2} MB")
    return payload


def ask_url(
    url: str,
    text: str,
    *,
    api_model: str,
    max_tokens: int,
    timeout_s: float,
    api_key_env: str | None,
) -> str:
    """The server's reply to one user message; JudgeError for a refusal, timeout or bad body."""
    body = {
        "model": api_model,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    endpoint = url.rstrip("/") + "/chat/completions"
    payload = _post(endpoint, json.dumps(body).encode(), headers, timeout_s)
    try:
        content = json.loads(payload)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeError(f"not a chat-completions answer: {payload[:80]!r}") from None
    if not isinstance(content, str):
        raise JudgeError("the answer's message has no text content")
    return content


def load_judge_lm(path: str, device: str) -> tuple[Any, Any]:
    """(model, tokenizer) of a causal LM judge, loaded once per process for (path, device)."""
    with _LOAD_LOCK:
        if (path, device) not in _LOADED:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                model: Any = AutoModelForCausalLM.from_pretrained(path)
            except (OSError, ValueError) as exc:
                raise JudgeError(f"does not load: {exc}") from None
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            tokenizer.padding_side = "left"  # generation continues every row from its end
            _LOADED[(path, device)] = (model.to(device).eval(), tokenizer)
        return _LOADED[(path, device)]


def ask_local(
    path: str, texts: list[str], *, device: str, max_new_tokens: int, batch_size: int
) -> list[str]:
    """A local causal LM's greedy replies to `texts`, in batches."""
    import torch

    model, tokenizer = load_judge_lm(path, device)
    templated = bool(getattr(tokenizer, "chat_template", None))
    if templated:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
            )
            for t in texts
        ]
    replies: list[str] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            add_special_tokens=not templated,
        ).to(device)
        with torch.no_grad():
            out = model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :]
        replies.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    return replies
