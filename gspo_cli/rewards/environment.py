"""`environment`: a tool environment's own reward (rollout.tools.environment's get_reward()).

The rollout engine scores each trajectory with its environment instance when the trajectory
ends; the training step passes that score to the rewards as the column ENVIRONMENT_REWARD."""

from __future__ import annotations

from gspo_cli.rewards.registry import REWARDS

ENVIRONMENT_REWARD = "environment_reward"  # the column each trajectory's score arrives in


@REWARDS.register("environment")
def environment_reward(completions: list[str], environment_reward: list[float]) -> list[float]:
    """The environment's get_reward() of each trajectory. None where there is none (no
    get_reward, or a hung call): the reward contract then wants the recipe's `none_as`."""
    return list(environment_reward)
