"""`algorithm.sequence_unit: turn`: each model turn of a tool trajectory is its own sequence.

A tool trajectory's response holds model turns separated by tool results (docs/tools.md). By
default (`trajectory`) GSPO's sequence is all of its model tokens; with `turn`, every maximal
run of model tokens is a sequence of its own, with its own ratio s_ik and 1/|y_ik|, and the
trajectory's advantage. Splitting rows this way lets every loss and aggregation run unchanged.
"""

from __future__ import annotations

import torch


def split_turns(turns: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per (response, turn) with a token in `mask`.

    Args:
        turns: `[B, T]` each model token's turn index, -1 elsewhere (`turn_ids`).
        mask: `[B, T]` the loss mask (a token out of it stays out).

    Returns:
        rows `[R]`: the response each new row comes from; masks `[R, T]`: its turn's tokens.
    """
    count = int(turns.max()) + 1 if turns.numel() else 0
    index = torch.arange(max(count, 1), device=turns.device)  # [K]
    masks = (turns.unsqueeze(0) == index[:, None, None]).to(mask.dtype) * mask  # [K, B, T]
    masks = masks.flatten(0, 1)  # [K * B, T], turn by turn
    rows = torch.arange(turns.shape[0], device=turns.device).repeat(len(index))  # [K * B]
    keep = masks.sum(dim=1) > 0  # [K * B]
    return rows[keep], masks[keep]
