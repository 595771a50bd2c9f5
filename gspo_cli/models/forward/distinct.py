"""Rows that repeat: a group's responses share one prompt, which need only be computed once."""

from __future__ import annotations

import torch


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`[u]` the first index of each distinct row of `rows` `[n, k]`, `[n]` each row's place
    among those u): `rows[first][inverse]` equals `rows`."""
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)  # [n] in 0..u-1
    n = len(inverse)
    first = torch.full((int(inverse.max()) + 1 if n else 0,), n, device=rows.device)  # [u]
    return first.scatter_reduce(0, inverse, torch.arange(n, device=rows.device), "amin"), inverse
