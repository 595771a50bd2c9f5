"""The three workloads (`--workload`): what sets the lengths, what they should be, and the
rewards, the same on every side."""

from __future__ import annotations

from typing import Any

import quickstart_workload
from cycle import PROMPTS, ROWS
from realistic_workload import (
    CAP,
    RealisticLengths,
    canonical_order,
    canonical_rows,
    drawn_lengths,
    drawn_rewards,
    flat_groups,
)

from .shapes import Shape, prompt_texts

WORKLOADS = ("fixed", "realistic", "quickstart")


def workload_prompts(tokenizer: Any, workload: str) -> tuple[list[str], list[str] | None]:
    """The 8 prompts, and their gold answers where the reward reads them (quickstart)."""
    if workload != "quickstart":
        return prompt_texts(tokenizer), None
    pairs = quickstart_workload.prompts(tokenizer, PROMPTS)
    return [text for text, _ in pairs], [answer for _, answer in pairs]


def score(texts: list[str]) -> list[float]:
    """Cheap and deterministic: 1 for about a quarter of the texts (a group of 8 scores all 0
    about one time in ten: it carries no signal, which only the defaults row exploits)."""
    return [float(sum(map(ord, t)) % 4 == 0) for t in texts]


def suppress_eos(tokenizer: Any) -> Any:
    from transformers import SuppressTokensLogitsProcessor

    return SuppressTokensLogitsProcessor([int(tokenizer.eos_token_id)])


def max_new_tokens(shape: Shape, workload: str) -> int:
    return shape.length if workload == "fixed" else CAP  # CAP: the quickstart's too


def length_processor(tokenizer: Any, workload: str) -> Any:
    """The one processor that sets the lengths: end-of-turn suppressed (fixed), the drawn
    lengths (realistic; stateful, so a process makes exactly one), or none (quickstart)."""
    if workload == "quickstart":
        return None
    if workload == "fixed":
        return suppress_eos(tokenizer)
    prompt_ids = [tokenizer(text)["input_ids"] for text in prompt_texts(tokenizer)]
    return RealisticLengths(int(tokenizer.eos_token_id), prompt_ids)


def expected_lengths(shape: Shape, workload: str, cycle: int) -> list[int] | None:
    """The lengths asked for; None where the model chooses them (quickstart)."""
    if workload == "quickstart":
        return None
    return [shape.length] * ROWS if workload == "fixed" else drawn_lengths(cycle)


class Rewards:
    """A side's reward function, called once per cycle with the batch's texts and each row's
    prompt index: `score` of the text (fixed), drawn_rewards of the canonical rows (realistic:
    the same rewards on every side, whatever the texts), or the maths verifier against the
    prompt's gold answer (quickstart). Keeps what the parent checks."""

    def __init__(self, workload: str, answers: list[str] | None = None) -> None:
        self.workload = workload
        self.answers = answers
        self.cycle = -1
        self.no_signal = 0  # groups that scored all equal, last cycle

    def __call__(self, texts: list[str], prompts: list[int]) -> list[float]:
        self.cycle += 1
        if self.workload == "fixed":
            scores = score(texts)
        elif self.answers is not None:
            scores = quickstart_workload.score(texts, [self.answers[p] for p in prompts])
        else:
            drawn = drawn_rewards(self.cycle)
            scores = [drawn[r] for r in canonical_rows(prompts)]
        self.no_signal = flat_groups(prompts, scores)
        return scores

    def result(self, prompts: list[int], lengths: list[int]) -> dict[str, Any]:
        """What a side reports of a cycle's batch (lengths in canonical order)."""
        return {
            "tokens": sum(lengths),
            "lengths": canonical_order(prompts, lengths),
            "no_signal": self.no_signal,
        }
