"""Which rows each forward and backward of an RL step takes.

Two savings that cannot change the update:
- A response whose advantage is exactly 0 adds exactly 0 to every policy loss's gradient (each
  loss is a multiple of A), so it is left out of the pi_old forward and of every training
  forward/backward. The loss normalisers still count it, so the gradient is the same.
- Rows are length-bucketed: sorted longest first and packed greedily into micro-batches under
  a row cap and a budget of computed tokens, so short responses are not padded to long ones.
  Where each distinct prompt of a micro-batch runs once (shared_prompts.py), a group's rows
  are worth keeping together: packing prompt by prompt is tried too, and the cheaper kept.

With several processes every rank must run the same number of forwards and backwards (ZeRO
gathers and reduces inside them, and the guard's checks are collectives): a rank with fewer
micro-batches runs filler ones, one row whose loss is multiplied by 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from gspo_cli.train.engines.distributed import DistContext


class MicroBatch(NamedTuple):
    rows: torch.Tensor  # [m] row indices into the step's batch
    filler: bool = False  # run only to keep ranks in step: its loss counts 0, its metrics none


def rows_with_signal(advantages: torch.Tensor, skip_zero_advantage: bool) -> torch.Tensor:
    """`[N]` bool: the rows that can move the policy (all of them when skipping is off)."""
    if not skip_zero_advantage:
        return torch.ones_like(advantages, dtype=torch.bool)
    return advantages != 0


def bucket(
    rows: torch.Tensor,
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    max_rows: int,
    max_tokens: int,
    prompts: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """`rows` in micro-batches of at most `max_rows` rows (0: no cap) and at most `max_tokens`
    computed tokens (0: no cap): rows x (longest prompt + longest response), or, when each
    distinct prompt of a micro-batch runs once (`prompts`: `[N]` a prompt id per row), distinct
    prompts x longest prompt + rows x longest response. Rows go longest first; with `prompts`,
    prompt by prompt too, and the order that computes fewer tokens is kept. A single row over
    the budget still gets a micro-batch of its own."""
    lengths = prompt_lengths + response_lengths  # [N]
    longest_first = sorted(rows.tolist(), key=lambda r: (-int(lengths[r]), r))
    pack = _Packing(prompt_lengths, response_lengths, prompts, max_rows, max_tokens)
    batches = pack(longest_first)
    if prompts is not None:
        group_longest: dict[int, int] = {}
        for r in longest_first:  # the first row seen of a prompt is its longest
            group_longest.setdefault(int(prompts[r]), int(lengths[r]))
        by_prompt = sorted(
            longest_first, key=lambda r: (-group_longest[int(prompts[r])], int(prompts[r]))
        )  # a stable sort: longest first within a prompt
        batches = min(batches, pack(by_prompt), key=lambda b: sum(map(pack.cost, b)))
    return [torch.tensor(b, dtype=torch.long) for b in batches]


class _Packing:
    """Greedy packing of rows, in the order given, under the row cap and the token budget."""

    def __init__(
        self,
        prompt_lengths: torch.Tensor,
        response_lengths: torch.Tensor,
        prompts: torch.Tensor | None,
        max_rows: int,
        max_tokens: int,
    ) -> None:
        self.p, self.t = prompt_lengths.tolist(), response_lengths.tolist()
        self.prompts = None if prompts is None else prompts.tolist()
        self.max_rows, self.max_tokens = max_rows, max_tokens

    def cost(self, batch: list[int]) -> int:
        """Tokens the micro-batch's forward computes, padding included."""
        prompt, response = max(self.p[r] for r in batch), max(self.t[r] for r in batch)
        if self.prompts is None:
            return len(batch) * (prompt + response)
        return len({self.prompts[r] for r in batch}) * prompt + len(batch) * response

    def __call__(self, order: list[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        prompt = response = 0  # the open micro-batch's longest prompt and response
        distinct: set[int] = set()  # its prompts (when they run once)
        for row in order:
            p, t = self.p[row], self.t[row]
            key = row if self.prompts is None else self.prompts[row]
            if batches:
                rows = len(batches[-1]) + 1
                passes = rows if self.prompts is None else len(distinct) + (key not in distinct)
                grown = passes * max(prompt, p) + rows * max(response, t)
                fits_rows = not self.max_rows or rows <= self.max_rows
                if fits_rows and (not self.max_tokens or grown <= self.max_tokens):
                    batches[-1].append(row)
                    prompt, response = max(prompt, p), max(response, t)
                    distinct.add(key)
                    continue
            batches.append([row])
            prompt, response, distinct = p, t, {key}
        return batches


def in_step(batches: list[torch.Tensor], ctx: DistContext, filler_row: int) -> list[MicroBatch]:
    """The micro-batches padded with fillers to the largest count over ranks, at least one (so
    that an optimiser step always has a backward behind it)."""
    count = max(1, int(ctx.all_reduce_max(float(len(batches)))))
    filler = torch.tensor([filler_row], dtype=torch.long)
    return [MicroBatch(b) for b in batches] + [MicroBatch(filler, True)] * (count - len(batches))


class StepPlan(NamedTuple):
    minibatches: list[list[MicroBatch]]  # the training micro-batches of each optimiser step
    forward: list[MicroBatch]  # the no-grad forwards (pi_old, reference): rows training uses
    trained_rows: int  # rows in some (non-filler) training micro-batch


@dataclass(frozen=True)
class Layout:
    """What a step's micro-batches are packed by: the rows' lengths, the caps, shared prompts
    and the ranks (which must run as many micro-batches as each other)."""

    prompt_lengths: torch.Tensor  # [N]
    response_lengths: torch.Tensor  # [N]
    caps: tuple[int, int]  # (rows, computed tokens) per micro-batch, 0 = none
    ctx: DistContext
    prompts: torch.Tensor | None = None  # [N] prompt ids, when each distinct prompt runs once

    def micro_batches(self, rows: torch.Tensor, filler_row: int) -> list[MicroBatch]:
        """`rows` bucketed, then padded with fillers of `filler_row` to the ranks' count."""
        lengths = (self.prompt_lengths, self.response_lengths)
        return in_step(bucket(rows, *lengths, *self.caps, self.prompts), self.ctx, filler_row)


def plan_updates(
    layout: Layout, splits: list[torch.Tensor], signal: torch.Tensor
) -> list[list[MicroBatch]]:
    """The training micro-batches of every minibatch (`splits`) over its rows with `signal`."""
    return [layout.micro_batches(rows[signal[rows]], int(rows[0])) for rows in splits]


def plan_forward(layout: Layout, rows: torch.Tensor | None = None) -> list[MicroBatch]:
    """The no-grad forwards' micro-batches: over `rows`, or every row (None: something reads
    pi_old of every row)."""
    if rows is None:
        rows = torch.arange(len(layout.prompt_lengths))
    return layout.micro_batches(rows, int(rows[0]))


def rows_used(minibatches: list[list[MicroBatch]]) -> torch.Tensor:
    """`[n]` sorted, every row some micro-batch of `minibatches` runs (fillers' too)."""
    return torch.cat([m.rows for micro in minibatches for m in micro]).unique()


def step_plan(minibatches: list[list[MicroBatch]], forward: list[MicroBatch]) -> StepPlan:
    """The step's one plan: the updates' micro-batches and the no-grad forwards'."""
    trained = sum(len(m.rows) for micro in minibatches for m in micro if not m.filler)
    return StepPlan(minibatches, forward, trained)
