"""Which rows each forward and backward of an RL step takes.

Two savings that cannot change the update:
- A response whose advantage is exactly 0 adds exactly 0 to every policy loss's gradient (each
  loss is a multiple of A), so it is left out of the pi_old forward and of every training
  forward/backward. The loss normalisers still count it, so the gradient is the same.
- Rows are length-bucketed: sorted longest first and packed greedily into micro-batches under
  a row cap and a padded-token budget, so short responses are not padded to long ones.

With several processes every rank must run the same number of forwards and backwards (ZeRO
gathers and reduces inside them, and the guard's checks are collectives): a rank with fewer
micro-batches runs filler ones, one row whose loss is multiplied by 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from gspo_cli.train.distributed import DistContext


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
) -> list[torch.Tensor]:
    """`rows` in micro-batches, longest first, each of at most `max_rows` rows (0: no cap) and at
    most `max_tokens` padded tokens (rows x (longest prompt + longest response); 0: no cap).
    A single row over the budget still gets a micro-batch of its own."""
    order = sorted(
        rows.tolist(),
        key=lambda r: (-int(prompt_lengths[r] + response_lengths[r]), r),
    )
    batches: list[list[int]] = []
    prompt_max = response_max = 0
    for row in order:
        p, t = int(prompt_lengths[row]), int(response_lengths[row])
        if batches:
            grown = (len(batches[-1]) + 1) * (max(prompt_max, p) + max(response_max, t))
            fits_rows = not max_rows or len(batches[-1]) < max_rows
            fits_tokens = not max_tokens or grown <= max_tokens
            if fits_rows and fits_tokens:
                batches[-1].append(row)
                prompt_max, response_max = max(prompt_max, p), max(response_max, t)
                continue
        batches.append([row])
        prompt_max, response_max = p, t
    return [torch.tensor(b, dtype=torch.long) for b in batches]


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


def plan_step(
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    splits: list[torch.Tensor],
    signal: torch.Tensor,
    caps: tuple[int, int],
    ctx: DistContext,
    forward_all: bool,
) -> StepPlan:
    """Micro-batches of every minibatch (`splits`) over its rows with `signal`, and of the
    no-grad forwards over every row they use (all rows when `forward_all`: something reads
    pi_old of every row). `caps`: (rows, padded tokens) per micro-batch, 0 = none."""
    minibatches = [
        in_step(
            bucket(rows[signal[rows]], prompt_lengths, response_lengths, *caps), ctx, int(rows[0])
        )
        for rows in splits
    ]
    used = torch.cat([m.rows for micro in minibatches for m in micro]).unique()  # sorted
    if forward_all:
        used = torch.arange(len(signal))
    forward = in_step(bucket(used, prompt_lengths, response_lengths, *caps), ctx, int(used[0]))
    trained = sum(len(m.rows) for micro in minibatches for m in micro if not m.filler)
    return StepPlan(minibatches, forward, trained)
