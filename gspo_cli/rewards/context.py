"""What the model-backed rewards (reward models, judges) need of the run: where the judge
cache lives, which device a model runs on, and the counters the step reports as metrics."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RewardContext:
    """Handed to rewards as the `reward_context` service; `drain` empties the counters into a
    step's metrics (`judge/parse_failures`, `judge/errors`...)."""

    cache_path: Path | None = None  # the judge cache (JSONL); None: in memory only
    device: str | None = None  # torch device of the trainer; None: cuda when there is one
    memo: dict[str, Any] = field(default_factory=dict)  # per-run objects (an in-memory cache)
    _counts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # judges count from threads

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n  # n = 0 still makes the key appear: a zero is a reading

    def drain(self) -> dict[str, float]:
        with self._lock:
            out = {key: float(value) for key, value in self._counts.items()}
            self._counts.clear()
        return out

    def torch_device(self) -> str:
        if self.device is not None:
            return self.device
        import torch  # only the model-backed rewards need it

        return "cuda" if torch.cuda.is_available() else "cpu"
