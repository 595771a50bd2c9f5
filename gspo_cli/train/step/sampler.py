"""Prompt order: a seeded permutation per epoch, with a position that checkpoints can restore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gspo_cli.train.step.curriculum import Curriculum


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


# Environment e > 0 shuffles its prompts with the run's seed plus e x this prime; environment 0
# keeps the run's seed, so a one-environment run draws exactly what a single-task run did.
ENVIRONMENT_SEED_STRIDE = 1_000_033


@dataclass(frozen=True)
class WeightSchedule:
    """Environment weights moving linearly from `first` (step 1) to `last` (step `steps`)."""

    first: list[float]
    last: list[float]
    steps: int

    def weights(self, step: int) -> list[float]:
        share = min(max((step - 1) / max(self.steps - 1, 1), 0.0), 1.0)
        return [a + (b - a) * share for a, b in zip(self.first, self.last, strict=True)]


class MixtureSampler:
    """Prompts from several environments (recipe `environments`), in one index space: the rows of
    environment e are `offsets[e] ..`. Each draw picks an environment by smooth weighted round
    robin (each gains its weight in credit, the richest is drawn and pays the total), so every
    span of draws holds each environment's share to within one prompt and the order depends on
    nothing but the weights; then that environment's next prompt in its own shuffled order,
    passing over the prompts a `curriculum` sets aside. One environment without a curriculum is
    exactly a `PromptSampler`, checkpoints included."""

    def __init__(
        self,
        sizes: list[int],
        weights: list[float],
        seed: int,
        curriculum: Curriculum | None = None,
        schedule: WeightSchedule | None = None,
    ) -> None:
        if len(sizes) != len(weights) or not any(w > 0 for w in weights):
            raise ValueError("a mixture needs one weight per environment, not all 0")
        self.samplers = [
            PromptSampler(size, seed + ENVIRONMENT_SEED_STRIDE * e) for e, size in enumerate(sizes)
        ]
        self.offsets = [sum(sizes[:e]) for e in range(len(sizes))]
        self.weights = list(weights)
        self.credits = [0.0] * len(sizes)
        self.curriculum = curriculum
        self.schedule = schedule

    def at_step(self, step: int) -> None:
        """Take step `step`'s weights (environments' weights may follow a schedule)."""
        if self.schedule is not None:
            self.weights = self.schedule.weights(step)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.samplers)

    def environment_of(self, index: int) -> int:
        """The environment whose rows hold run row `index`."""
        return max(e for e, offset in enumerate(self.offsets) if offset <= index)

    def next(self, count: int) -> list[int]:
        """The next `count` run row indices."""
        return [self._draw() for _ in range(count)]

    def _draw(self) -> int:
        e = 0
        if len(self.samplers) > 1:
            total = sum(self.weights)
            self.credits = [c + w for c, w in zip(self.credits, self.weights, strict=True)]
            e = max(range(len(self.credits)), key=lambda k: (self.credits[k], -k))
            self.credits[e] -= total
        sampler, offset = self.samplers[e], self.offsets[e]
        if self.curriculum is None:
            return offset + sampler.next(1)[0]
        for _ in range(sampler.size):  # at most one pass over its order
            row = offset + sampler.next(1)[0]
            if not self.curriculum.skips(row, sampler.epoch):
                return row
        # every prompt of the environment sits out: let them all back rather than stall
        self.curriculum.release(range(offset, offset + sampler.size))
        return offset + sampler.next(1)[0]

    def observe(self, rows: list[int], pass_rates: list[float]) -> None:
        """A step's groups and their pass rates, for the curriculum (if any)."""
        if self.curriculum is not None:
            epochs = [self.samplers[self.environment_of(row)].epoch for row in rows]
            self.curriculum.observe(rows, pass_rates, epochs)

    def state_dict(self) -> dict[str, Any]:
        state = (
            self.samplers[0].state_dict()
            if len(self.samplers) == 1
            else {
                "credits": list(self.credits),
                "environments": [s.state_dict() for s in self.samplers],
            }
        )
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.curriculum is not None:
            if "curriculum" not in state:
                raise ValueError("the checkpoint was made without data.curriculum")
            self.curriculum.load_state_dict(state["curriculum"])
        if len(self.samplers) == 1:
            self.samplers[0].load_state_dict(state)
            return
        if len(state.get("environments", [])) != len(self.samplers):
            raise ValueError(
                f"the checkpoint's sampler has {len(state.get('environments', [1]))} "
                f"environments, the recipe {len(self.samplers)}"
            )
        self.credits = [float(c) for c in state["credits"]]
        for sampler, saved in zip(self.samplers, state["environments"], strict=True):
            sampler.load_state_dict(saved)
