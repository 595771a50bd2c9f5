"""Turn a rollout into padded training tensors: [left-padded prompt | right-padded response]."""

from __future__ import annotations

from typing import NamedTuple

import torch

from gspo_cli.rollout_batch import RolloutBatch


class TrainBatch(NamedTuple):
    input_ids: torch.Tensor  # [N, P + T] prompt left-padded to P, response right-padded to T
    attention_mask: torch.Tensor  # [N, P + T] 1 on real tokens
    position_ids: torch.Tensor  # [N, P + T] positions that skip left padding, as generate does
    response_mask: torch.Tensor  # [N, T] 1 on the model's response tokens (not tool results)
    prompt_width: int  # P

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(*(t.to(device) for t in self[:4]), self.prompt_width)

    def select(self, index: torch.Tensor) -> TrainBatch:
        return TrainBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.position_ids[index],
            self.response_mask[index],
            self.prompt_width,
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
        )


def build_train_batch(rollout: RolloutBatch, pad_id: int) -> TrainBatch:
    n = len(rollout.prompt_ids)
    p_width = max(len(p) for p in rollout.prompt_ids)
    t_width = max(len(c) for c in rollout.completion_ids)
    input_ids = torch.full((n, p_width + t_width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, p_width + t_width), dtype=torch.long)
    response_mask = torch.zeros((n, t_width), dtype=torch.float32)
    for i, (prompt, completion) in enumerate(
        zip(rollout.prompt_ids, rollout.completion_ids, strict=True)
    ):
        input_ids[i, p_width - len(prompt) : p_width] = torch.tensor(prompt)
        input_ids[i, p_width : p_width + len(completion)] = torch.tensor(completion)
        attention[i, p_width - len(prompt) : p_width + len(completion)] = 1
        response_mask[i, : len(completion)] = 1
        if rollout.from_tool is not None:  # a tool's tokens are context, never targets
            response_mask[i, : len(completion)] -= torch.tensor(rollout.from_tool[i]).float()
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)  # [N, P + T]
    return TrainBatch(input_ids, attention, position_ids, response_mask, p_width)


def pad_logprobs(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """`[N, width]` from N variable-length `[len_i]` tensors, zero-padded (float32, or float64
    where the rows are)."""
    dtype = torch.float64 if any(r.dtype == torch.float64 for r in rows) else torch.float32
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


def check_sampled_ids(batch: TrainBatch, rollout: RolloutBatch) -> None:
    """Token in, token out: every row of `batch` holds exactly the ids the engine returned, and
    its targets are exactly the model's tokens. Runs on every step (an AssertionError is a bug)."""
    p = batch.prompt_width
    for i, completion in enumerate(rollout.completion_ids):
        row = batch.input_ids[i, p : p + len(completion)].tolist()
        assert row == completion, f"row {i}: the trainer's ids differ from the engine's"
        model = [not t for t in rollout.from_tool[i]] if rollout.from_tool else [True] * len(row)
        targets = batch.response_mask[i, : len(completion)].bool().tolist()
        assert targets == model, f"row {i}: the loss mask does not match the tokens' sources"


def turn_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """`[N, T]` the index of each model token's turn (maximal runs of response_mask 1 between
    tool results: `algorithm.sequence_unit: turn`), -1 elsewhere."""
    ones = response_mask > 0  # [N, T]
    before = torch.cat([torch.zeros_like(ones[:, :1]), ones[:, :-1]], dim=1)  # [N, T]
    starts = (ones & ~before).long()  # [N, T] 1 where a turn begins
    return torch.where(ones, starts.cumsum(dim=1) - 1, torch.full_like(starts, -1))
