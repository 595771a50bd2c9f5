"""Scored groups: what the collection phase of an RL step hands to its training phase.

The collection phase (train/step/collection.py) generates G responses for each prompt and
scores them (`collect_groups`); with dynamic sampling it runs several rounds and assembles one
batch from the groups it keeps (`select_groups`, `concat_groups`); the training phase
(`update.train_groups`) turns the result into advantages and updates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from gspo_cli.rollout.base import RolloutBatch


@dataclass
class ScoredGroups:
    """Whole groups of responses with their rewards, laid out group by group."""

    rollout: RolloutBatch  # N = groups x G responses
    rewards: list[float]  # [N] the reward functions' weighted sum plus the overlong penalty
    correct: list[float]  # [N] 1.0 where the first reward function scored 1.0 or more
    overlong: list[float]  # [N] the overlong penalty inside `rewards` (<= 0; 0 when off)
    in_loss: list[bool]  # [groups] False: a dropped group that only fills the batch (mask 0)
    reward_metrics: dict[str, float] = field(default_factory=dict)  # reward/<name>/mean
    time_rollout_s: float = 0.0
    time_reward_s: float = 0.0
    # [N] answer forms (train/step/rewards.py RewardScores), None when not measured; NaN for
    # the responses of an environment that does not measure them, in a mixture
    answered: list[float] | None = None
    correct_any_form: list[float] | None = None

    @property
    def group_size(self) -> int:
        return len(self.rewards) // max(1, len(self.in_loss))

    def loss_rows(self, mask_truncated: bool) -> torch.Tensor:
        """`[N]` bool: the responses that enter the loss and its normalisers. Not the filling
        groups, nor (`mask_truncated`, DAPO's overlong filtering) responses cut at the cap."""
        rows = torch.tensor(self.in_loss, dtype=torch.bool).repeat_interleave(self.group_size)
        if mask_truncated:
            rows &= ~torch.tensor(self.rollout.truncated, dtype=torch.bool)
        return rows  # [N]


def _rollout_rows(batch: RolloutBatch, rows: list[int]) -> RolloutBatch:
    """Rows `rows` of `batch`, every per-response field alike (tool sources included)."""
    picked = {
        f.name: None
        if getattr(batch, f.name) is None
        else [getattr(batch, f.name)[r] for r in rows]
        for f in fields(RolloutBatch)
    }
    return RolloutBatch(**picked)


def select_groups(scored: ScoredGroups, groups: list[int], in_loss: bool = True) -> ScoredGroups:
    """Groups `groups` of `scored`, in that order; `in_loss` False marks them as filling.
    Timings and reward metrics stay with the round that measured them (zero and empty here)."""
    g = scored.group_size
    rows = [group * g + j for group in groups for j in range(g)]
    return ScoredGroups(
        _rollout_rows(scored.rollout, rows),
        [scored.rewards[r] for r in rows],
        [scored.correct[r] for r in rows],
        [scored.overlong[r] for r in rows],
        [in_loss and scored.in_loss[group] for group in groups],
        answered=_pick(scored.answered, rows),
        correct_any_form=_pick(scored.correct_any_form, rows),
    )


def _pick(values: list[float] | None, rows: list[int]) -> list[float] | None:
    return None if values is None else [values[r] for r in rows]


def _joined(parts: list[ScoredGroups], name: str) -> list[float] | None:
    """Per-response values `name` of every part one after the other; None when no part has
    them, NaN (not measured) for the responses of a part without them (an environment whose
    reward does not measure answer forms, in a mixture)."""
    values = [getattr(part, name) for part in parts]
    if all(v is None for v in values):
        return None
    nan = float("nan")
    return [
        x for part, v in zip(parts, values, strict=True) for x in v or [nan] * len(part.rewards)
    ]


def concat_groups(
    parts: list[ScoredGroups], reward_metrics: dict[str, float], times: tuple[float, float]
) -> ScoredGroups:
    """The groups of `parts` one after the other, with the step's reward metrics and its
    (rollout, reward) seconds."""
    first = parts[0].rollout  # a field None in one part is None in all (one engine, one run)
    rollout = RolloutBatch(
        **{
            f.name: None
            if getattr(first, f.name) is None
            else [value for part in parts for value in getattr(part.rollout, f.name)]
            for f in fields(RolloutBatch)
        }
    )
    return ScoredGroups(
        rollout,
        [r for part in parts for r in part.rewards],
        [c for part in parts for c in part.correct],
        [o for part in parts for o in part.overlong],
        [k for part in parts for k in part.in_loss],
        reward_metrics,
        *times,
        _joined(parts, "answered"),
        _joined(parts, "correct_any_form"),
    )
