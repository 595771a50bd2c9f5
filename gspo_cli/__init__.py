"""gspo-cli: reinforcement-learning post-training with GSPO, GSPO-token and GRPO."""

__version__ = "0.1.0"
