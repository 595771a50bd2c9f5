"""A rollout turned into the padded training tensors, and the token-in/token-out check that the
trainer scores exactly the engine's ids."""

from __future__ import annotations

import torch

from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.rollout.batch import RolloutBatch


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
    temperature = None if rollout.temperatures is None else torch.tensor(rollout.temperatures)
    return TrainBatch(input_ids, attention, position_ids, response_mask, p_width, temperature)


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
