"""Group-relative advantages (GSPO paper, Eq. 6), shared by GRPO and GSPO."""

from __future__ import annotations

import torch

# Std convention: population std (divide by G, not G-1) plus this epsilon in the denominator.
# The paper names neither; population std keeps a two-sample group at advantages of exactly +-1.
ADVANTAGE_STD_EPS = 1e-6


def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: bool = True) -> torch.Tensor:
    """A_i = (r_i - mean(r_group)) / (std(r_group) + eps), computed within each group.

    Args:
        rewards: `[N]` rewards ordered group by group (N = Q * group_size).
        group_size: G, the number of responses sampled per prompt.
        scale: divide by the group std (the paper); False gives mean-only advantages.

    Returns:
        `[N]` advantages. A group whose rewards are all equal gets exactly 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    # float64 throughout, float32 at the end: a KL penalty in the reward differs between a
    # group's responses by far less than float32 resolves next to a reward of 1 (~6e-8).
    grouped = rewards.double().view(-1, group_size)  # [Q, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [Q, G]
    if scale:
        std = grouped.std(dim=1, keepdim=True, unbiased=False)  # [Q, 1]
        centred = centred / (std + ADVANTAGE_STD_EPS)
    # Equal rewards must give exactly 0; floating-point means can leave a 1e-8 residue.
    constant = zero_signal_groups(rewards, group_size).unsqueeze(1)  # [Q, 1]
    return torch.where(constant, torch.zeros_like(centred), centred).view(-1).float()  # [N]


def zero_signal_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[Q]` bool: True for groups whose rewards are all equal (no learning signal)."""
    grouped = rewards.view(-1, group_size)  # [Q, G]
    return (grouped == grouped[:, :1]).all(dim=1)  # [Q]
