"""Evaluation: generate-and-judge, scoring, metrics (avg@k, pass@k, maj@k) and Elo estimates.

Benchmarks and problems are data: they live in `gspo_cli.data`.
"""

from gspo_cli.eval.codeelo import (
    CodeEloResult,
    Contest,
    ContestProblem,
    ContestResult,
    Participant,
    codeelo_rating,
    contest_result,
    load_standings_cache,
)
from gspo_cli.eval.elo import (
    elo_bootstrap_ci,
    elo_from_problem_ratings,
    elo_from_success_rates,
    rating_from_rank,
)
from gspo_cli.eval.metrics import (
    LengthStats,
    avg_at_k,
    bootstrap_ci,
    length_stats,
    maj_at_k,
    mean_maj_at_k,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_table,
    per_problem_rates,
    std_err,
    truncation_share,
)

__all__ = [
    "CodeEloResult",
    "Contest",
    "ContestProblem",
    "ContestResult",
    "LengthStats",
    "Participant",
    "avg_at_k",
    "bootstrap_ci",
    "codeelo_rating",
    "contest_result",
    "elo_bootstrap_ci",
    "elo_from_problem_ratings",
    "elo_from_success_rates",
    "length_stats",
    "load_standings_cache",
    "maj_at_k",
    "mean_maj_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "pass_at_k_table",
    "per_problem_rates",
    "rating_from_rank",
    "std_err",
    "truncation_share",
]
