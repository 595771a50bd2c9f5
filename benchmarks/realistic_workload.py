"""The realistic workload of vs_trl: seeded uneven lengths and groups without signal, the
same on every side (its docstring says what each side computes with them).

A row's "canonical index" is prompt * SAMPLES + sample, where prompt is the prompt's index in
the benchmark's prompt list and sample counts the earlier rows of that prompt in the same batch.
gspo-cli and the floor generate in exactly this order; TRL's RepeatSampler keeps each prompt's 8
rows together but shuffles the prompts, so rows are mapped through their prompt, never their
place.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import torch
from cycle import PROMPT_TOKENS, PROMPTS, ROWS, SAMPLES

CAP = 64  # max_new_tokens of the realistic workload, every shape
MEDIAN, SIGMA, MIN_LENGTH, AT_CAP = 17, 0.5, 2, 2  # lognormal lengths; AT_CAP rows truncated


def drawn_lengths(cycle: int) -> list[int]:
    """Completion tokens (end-of-turn included) of the canonical rows of `cycle`: a lognormal of
    median MEDIAN and sigma SIGMA, rounded, clamped to [MIN_LENGTH, CAP - 1] (these end with
    end-of-turn), then AT_CAP rows at random set to CAP (truncated, no end-of-turn), so the padded
    batch is CAP wide. About 20.6 tokens a row on average; some 4 to 5 rows a cycle above 40."""
    rng = random.Random(10_000 + cycle)
    mu = math.log(MEDIAN)
    lengths = [
        min(CAP - 1, max(MIN_LENGTH, round(rng.lognormvariate(mu, SIGMA)))) for _ in range(ROWS)
    ]
    for row in rng.sample(range(ROWS), AT_CAP):
        lengths[row] = CAP
    return lengths


def no_signal_groups(cycle: int) -> int:
    """1 group of 8 a cycle, 2 in every fourth (cycle % 4 == 2): 15.6% of groups in the long
    run, 15% over cycles 1 to 5 (a five-round run; cycle 0 warms up), 12.5% in cycle 1."""
    return 2 if cycle % 4 == 2 else 1


def drawn_rewards(cycle: int) -> list[float]:
    """The canonical rows' rewards of `cycle`: no_signal_groups(cycle) groups at random score
    all 0 or all 1 (zero advantage); every other group has 1 to 7 of its 8 rows at 1."""
    rng = random.Random(20_000 + cycle)
    flat = set(rng.sample(range(PROMPTS), no_signal_groups(cycle)))
    scores: list[float] = []
    for group in range(PROMPTS):
        if group in flat:
            scores += [float(rng.random() < 0.5)] * SAMPLES
        else:
            right = set(rng.sample(range(SAMPLES), rng.randint(1, SAMPLES - 1)))
            scores += [float(sample in right) for sample in range(SAMPLES)]
    return scores


def canonical_rows(prompts: list[int]) -> list[int]:
    """The canonical index of each row of a batch, given each row's prompt index."""
    seen: Counter[int] = Counter()
    rows = []
    for prompt in prompts:
        rows.append(prompt * SAMPLES + seen[prompt])
        seen[prompt] += 1
    return rows


def canonical_order(prompts: list[int], values: list[Any]) -> list[Any]:
    """`values` (one per row of a full cycle's batch) rearranged into canonical order."""
    out: list[Any] = [None] * ROWS
    for row, value in zip(canonical_rows(prompts), values, strict=True):
        out[row] = value
    return out


def flat_groups(prompts: list[int], scores: list[float]) -> int:
    """How many prompts' rows all scored the same (no signal), as measured on this side."""
    values: dict[int, set[float]] = {}
    for prompt, value in zip(prompts, scores, strict=True):
        values.setdefault(prompt, set()).add(value)
    return sum(len(v) == 1 for v in values.values())


class RealisticLengths:
    """A transformers logits processor giving each row its drawn length: end-of-turn suppressed
    before the row's last token, forced (every other score -inf) at it; a row drawn at CAP never
    ends (max_new_tokens stops it). Rows already ended keep getting end-of-turn forced, which
    `generate` ignores (it pads them). One instance per process: it counts the `generate` calls
    (cycles) by their first step, and knows each row's prompt by its PROMPT_TOKENS prompt ids
    (prompts are never padded), hence its canonical row."""

    def __init__(self, eos: int, prompt_ids: list[list[int]]) -> None:
        self.eos = eos
        self.prompts = {tuple(ids): i for i, ids in enumerate(prompt_ids)}
        self.cycle = -1
        self.lengths = torch.zeros(0, dtype=torch.long)  # [n] of the current generate

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.shape[1] - PROMPT_TOKENS  # tokens so far; this call picks the next
        if generated == 0:  # the first step of a new generate, i.e. of a new cycle
            self.cycle += 1
            prompts = [self.prompts[tuple(ids)] for ids in input_ids[:, :PROMPT_TOKENS].tolist()]
            drawn = drawn_lengths(self.cycle)
            rows = canonical_rows(prompts)
            self.lengths = torch.tensor([drawn[r] for r in rows], device=input_ids.device)
        ends = (self.lengths <= generated + 1) & (self.lengths < CAP)  # [n]: pick end-of-turn
        out = scores.clone()
        out[:, self.eos] = -math.inf
        out[ends] = -math.inf
        out[ends, self.eos] = 0.0
        return out

    def step_done(self, chosen: torch.Tensor, going: torch.Tensor) -> None:
        """gspo-cli's decoding loop dropped its finished rows: keep the others' lengths."""
        self.lengths = self.lengths[going]
