"""Counting the calls every side makes: `generate`, forwards, backward passes, optimizer
steps."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook


class Calls:
    """Counts `generate`, backbone forwards (inside generate apart), backward passes and
    optimizer steps of `model`, with hooks that every side goes through. `processor`, when set,
    is appended to every `generate`'s logits processors (how TRL gets the realistic lengths)."""

    def __init__(self, model: Any) -> None:
        self.counts: Counter[str] = Counter()
        self.generating = False
        self.processor: Any = None
        cls = type(model)
        cls.generate = self.counted(cls.generate)  # TRL patches the instance's forward only
        model.base_model.register_forward_hook(self._forward)  # TRL's fused head calls it too
        self.model, self.armed = model, False
        register_optimizer_step_post_hook(self._step)

    def counted(self, generate: Any) -> Any:
        """`generate`, or gspo-cli's rollout engine (its own decoding loop drops finished rows),
        counted as one generate call whose forwards are decode steps; a `generate` inside one
        (the engine's, where it cannot drop finished rows) is part of it."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.generating:
                return generate(*args, **kwargs)
            self.counts["generate"] += 1
            if self.processor is not None:
                from transformers import LogitsProcessorList

                own = kwargs.get("logits_processor") or []
                kwargs["logits_processor"] = LogitsProcessorList([*own, self.processor])
            self.generating = True
            try:
                return generate(*args, **kwargs)
            finally:
                self.generating = False

        return wrapper

    def _forward(self, module: Any, args: Any, output: Any) -> None:
        if self.generating:
            self.counts["decode steps"] += 1
            self.counts["decoded rows"] += output.last_hidden_state.shape[0]
        else:
            self.counts["forward"] += 1
            self.counts["forward tokens"] += output.last_hidden_state.shape[:2].numel()
            self._arm_backward()

    def _arm_backward(self) -> None:
        """A hook on one trainable weight counts backward passes: its gradient is accumulated
        once per backward however often it is used. Armed at the first forward outside
        `generate`, once every side has made its weights trainable or frozen (LoRA: peft
        freezes the model, so the final norm's weight, the full shapes' choice, gets none)."""
        if self.armed:
            return
        norm = self.model.base_model.norm.weight
        trainable = (
            norm
            if norm.requires_grad
            else next(p for p in self.model.parameters() if p.requires_grad)
        )
        trainable.register_hook(self._backward)
        self.armed = True

    def _backward(self, grad: torch.Tensor) -> None:
        self.counts["backward"] += 1

    def _step(self, *_: Any) -> None:
        self.counts["optimizer.step"] += 1

    def take(self) -> dict[str, int]:
        out = dict(self.counts)
        self.counts.clear()
        return out
