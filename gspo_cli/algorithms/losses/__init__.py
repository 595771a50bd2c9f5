"""The policy losses, one module per family, each registering its `LossSpec` in `LOSS_SPECS`:
`gspo.py` (GSPO, GSPO-token), `grpo.py`, and GSPO's successors `luspo.py`, `sapo.py`,
`gmpo.py`, `cispo.py`, `dppo.py` (DPPO, TV and KL), `vespo.py`. `spec.py` holds the spec and
the registry, `ratios.py` what the families share. Importing this package registers every
family; adding a loss adds one module here, its import below and its test.
"""

# Each family registers its spec(s) on import: imported for that side effect.
from gspo_cli.algorithms.losses import (  # noqa: F401
    cispo,
    dppo,
    gmpo,
    grpo,
    gspo,
    luspo,
    sapo,
    vespo,
)
from gspo_cli.algorithms.losses.ratios import (
    LOG_RATIO_CLAMP,
    clipped_objective,
    sequence_advantage,
    sequence_log_ratio,
    token_ratio,
)
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    PolicyLoss,
    TokenLoss,
    resolve_loss_agg,
)

__all__ = [
    "DEFAULT_LOSS_OPTIONS",
    "LOG_RATIO_CLAMP",
    "LOSS_SPECS",
    "LossOptions",
    "LossSpec",
    "PolicyLoss",
    "TokenLoss",
    "clipped_objective",
    "resolve_loss_agg",
    "sequence_advantage",
    "sequence_log_ratio",
    "token_ratio",
]
