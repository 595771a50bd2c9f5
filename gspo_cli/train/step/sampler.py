"""Prompt order: a seeded permutation per epoch, with a position that checkpoints can restore."""

from __future__ import annotations

from typing import Any

import torch


class PromptSampler:
    def __init__(self, size: int, seed: int) -> None:
        if size == 0:
            raise ValueError("the training data set is empty")
        self.size, self.seed = size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def next(self, count: int) -> list[int]:
        """The next `count` row indices, starting a new shuffled epoch when one runs out."""
        out: list[int] = []
        while len(out) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation()
