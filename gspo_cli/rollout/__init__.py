"""Rollout engines behind one Protocol (HF transformers generate; vLLM fits the same)."""

from gspo_cli.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from gspo_cli.rollout.hf import HFGenerateEngine

__all__ = ["HFGenerateEngine", "RolloutBatch", "RolloutEngine", "SamplingParams"]
