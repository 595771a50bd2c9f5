"""The algorithm core: pure torch functions, no transformers, no recipe objects, no I/O."""

from gspo_cli.algorithms.advantages import ADVANTAGE_STD_EPS, group_advantages, zero_signal_groups
from gspo_cli.algorithms.aggregation import (
    DEFAULT_LOSS_AGG,
    LOSS_AGGREGATIONS,
    aggregate,
    loss_normalizer,
)
from gspo_cli.algorithms.correction import (
    ROLLOUT_CORRECTIONS,
    Correction,
    CorrectionLimits,
    mismatch_metrics,
    rollout_correction,
)
from gspo_cli.algorithms.losses import (
    LOG_RATIO_CLAMP,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    resolve_loss_agg,
    sequence_log_ratio,
)
from gspo_cli.algorithms.policy import compute_policy_loss

__all__ = [
    "ADVANTAGE_STD_EPS",
    "DEFAULT_LOSS_AGG",
    "LOG_RATIO_CLAMP",
    "LOSS_AGGREGATIONS",
    "LOSS_SPECS",
    "ROLLOUT_CORRECTIONS",
    "Correction",
    "CorrectionLimits",
    "LossOptions",
    "LossSpec",
    "aggregate",
    "compute_policy_loss",
    "group_advantages",
    "loss_normalizer",
    "mismatch_metrics",
    "resolve_loss_agg",
    "rollout_correction",
    "sequence_log_ratio",
    "zero_signal_groups",
]
