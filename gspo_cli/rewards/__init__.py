"""Rewards: plain functions fn(completions, **dataset_columns) -> list[float], by name."""

from gspo_cli.rewards.code import JudgeResult, code_reward, judge_completion, judge_program
from gspo_cli.rewards.environment import ENVIRONMENT_REWARD, environment_reward
from gspo_cli.rewards.extract import last_boxed
from gspo_cli.rewards.judges import judge_reward
from gspo_cli.rewards.math_verifier import MathVerifierPool, check_answer, math_reward
from gspo_cli.rewards.reasoning_gym import reasoning_gym_reward
from gspo_cli.rewards.registry import REWARDS, RewardFn
from gspo_cli.rewards.reward_model import reward_model_reward

__all__ = ["REWARDS", "MathVerifierPool", "RewardFn", "check_answer", "last_boxed", "math_reward"]
__all__ += ["JudgeResult", "code_reward", "judge_completion", "judge_program"]
__all__ += ["ENVIRONMENT_REWARD", "environment_reward"]
__all__ += ["reasoning_gym_reward"]
__all__ += ["judge_reward", "reward_model_reward"]
