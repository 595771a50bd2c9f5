"""DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13), a reward on response length.

    R_len(|y|) = 0                                       if |y| <= L_max - L_cache
               = ((L_max - L_cache) - |y|) / L_cache      if L_max - L_cache < |y| <= L_max
               = -1                                       if |y| > L_max

times `penalty` (verl's `penalty_factor`, 1 in the paper). L_max is the response cap, so a
response of exactly L_max tokens gets the full -penalty, as the formula says, whether it hit
the cap (truncated) or ended with EOS on its last token: both TRL and verl do the same. |y|
counts the EOS token when one was generated (TRL's and verl's response lengths do).
"""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0
) -> torch.Tensor:
    """`[N]` R_len of responses of `lengths` `[N]` tokens (<= 0); all 0 when `buffer` is 0.

    Args:
        lengths: `[N]` response lengths |y_i| in tokens.
        max_len: L_max, the longest a response may be (rollout.max_new_tokens).
        buffer: L_cache, the tokens before L_max over which the penalty grows linearly.
        penalty: the penalty at L_max and beyond (a factor on the paper's -1).
    """
    if buffer < 0 or buffer >= max_len:
        raise ValueError(f"the overlong buffer ({buffer}) must be in [0, {max_len})")
    if penalty < 0:
        raise ValueError(f"the overlong penalty ({penalty}) must be >= 0")
    if buffer == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    free = max_len - buffer  # L_max - L_cache: the longest response with no penalty
    linear = (free - lengths.float()) / buffer  # [N]; -1 at L_max
    return linear.clamp(min=-1.0, max=0.0) * penalty  # [N]
