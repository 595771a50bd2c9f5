"""The judge cache: a judge's scores by (prompt, completion(s), judge id, template).

On disk it is the run folder's `judge_cache.jsonl` (append-only, each line fsync'd, torn lines
skipped), so a resumed run asks the judge nothing it has answered; one object per file, shared
by every judge of the process. Only answers that parsed are kept: an error or a parse failure
is asked again next time.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from gspo_cli.runs.folder import append_jsonl, read_jsonl

_OPEN: dict[Path | None, JudgeCache] = {}
_OPEN_LOCK = threading.Lock()


def cache_key(judge_id: str, template: str, prompt: Any, completions: list[str]) -> str:
    """The key of one judge question: a hash of everything its answer depends on."""
    text = json.dumps([judge_id, template, prompt, completions], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeCache:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._scores: dict[str, list[float]] = {}
        for record in read_jsonl(path) if path is not None else []:
            scores = record.get("scores")
            if isinstance(record.get("key"), str) and isinstance(scores, list):
                self._scores[record["key"]] = [float(s) for s in scores]

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: str) -> list[float] | None:
        with self._lock:
            return self._scores.get(key)

    def put(self, key: str, scores: list[float]) -> None:
        with self._lock:
            if key in self._scores:
                return
            self._scores[key] = scores
            if self.path is not None:
                append_jsonl(self.path, {"key": key, "scores": scores})


def open_cache(path: Path | None) -> JudgeCache:
    """The process's cache for `path` (None: in memory), read from disk once."""
    with _OPEN_LOCK:
        if path not in _OPEN:
            _OPEN[path] = JudgeCache(path)
        return _OPEN[path]
