"""Rollout engines behind one Protocol, chosen by name (`rollout.engine`): hf, vllm.

This package's top level imports no transformers or vLLM: the engines load only when chosen.
"""

from gspo_cli.rollout.base import EngineSpec, RolloutEngine, SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.engines import make_rollout_engine

__all__ = [
    "EngineSpec",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "make_rollout_engine",
]
