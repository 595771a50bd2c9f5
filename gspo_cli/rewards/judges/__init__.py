"""LLM judges (and built-in rules) as rewards: `judge`, pointwise or per group (docs/judges.md)."""

from gspo_cli.rewards.judges.entry import judge_reward, make_judge
from gspo_cli.rewards.judges.reward import Judge

__all__ = ["Judge", "judge_reward", "make_judge"]
