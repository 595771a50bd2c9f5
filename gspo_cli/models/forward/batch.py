"""The padded training tensors a forward takes: [left-padded prompt | right-padded response].
Built from a rollout by gspo_cli.train.step.train_batch (models/ knows nothing of rollouts)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class TrainBatch(NamedTuple):
    input_ids: torch.Tensor  # [N, P + T] prompt left-padded to P, response right-padded to T
    attention_mask: torch.Tensor  # [N, P + T] 1 on real tokens
    position_ids: torch.Tensor  # [N, P + T] positions that skip left padding, as generate does
    response_mask: torch.Tensor  # [N, T] 1 on the model's response tokens (not tool results)
    prompt_width: int  # P
    # [N] the temperature each row was sampled at, where rows differ (environments of their own
    # temperature); None: every row at the temperature the forward is given
    temperature: torch.Tensor | None = None

    def to(self, device: torch.device) -> TrainBatch:
        moved = None if self.temperature is None else self.temperature.to(device)
        return TrainBatch(*(t.to(device) for t in self[:4]), self.prompt_width, moved)

    def select(self, index: torch.Tensor) -> TrainBatch:
        return TrainBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.position_ids[index],
            self.response_mask[index],
            self.prompt_width,
            None if self.temperature is None else self.temperature[index],
        )

    def trimmed(self) -> TrainBatch:
        """Drop columns that are padding in every row (saves compute in small minibatches)."""
        real = self.attention_mask.bool()
        first = int(real.any(dim=0).nonzero()[0])
        width = self.prompt_width - first
        response = self.attention_mask[:, self.prompt_width :].bool()  # [N, T] tool tokens too
        last_resp = int(response.any(dim=0).nonzero()[-1]) + 1
        cols = slice(first, self.prompt_width + last_resp)
        return TrainBatch(
            self.input_ids[:, cols],
            self.attention_mask[:, cols],
            self.position_ids[:, cols],
            self.response_mask[:, :last_resp],
            width,
            self.temperature,
        )


def pad_logprobs(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """`[N, width]` from N variable-length `[len_i]` tensors, zero-padded (float32, or float64
    where the rows are)."""
    dtype = torch.float64 if any(r.dtype == torch.float64 for r in rows) else torch.float32
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


def turn_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """`[N, T]` the index of each model token's turn (maximal runs of response_mask 1 between
    tool results: `algorithm.sequence_unit: turn`), -1 elsewhere."""
    ones = response_mask > 0  # [N, T]
    before = torch.cat([torch.zeros_like(ones[:, :1]), ones[:, :-1]], dim=1)  # [N, T]
    starts = (ones & ~before).long()  # [N, T] 1 where a turn begins
    return torch.where(ones, starts.cumsum(dim=1) - 1, torch.full_like(starts, -1))
