"""Evaluation building blocks: metrics, Elo estimates and benchmark loading (pure, no model)."""

from gspo_cli.eval.benchmarks import (
    BENCHMARKS,
    BenchmarkSpec,
    build_prompt,
    filter_by_date,
    load_benchmark,
)
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
from gspo_cli.eval.loaders import CodeTests, parse_tests
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
from gspo_cli.eval.problems import Problem

__all__ = [
    "BENCHMARKS",
    "BenchmarkSpec",
    "CodeEloResult",
    "CodeTests",
    "Contest",
    "ContestProblem",
    "ContestResult",
    "LengthStats",
    "Participant",
    "Problem",
    "avg_at_k",
    "bootstrap_ci",
    "build_prompt",
    "codeelo_rating",
    "contest_result",
    "elo_bootstrap_ci",
    "elo_from_problem_ratings",
    "elo_from_success_rates",
    "filter_by_date",
    "length_stats",
    "load_benchmark",
    "load_standings_cache",
    "maj_at_k",
    "mean_maj_at_k",
    "mean_pass_at_k",
    "parse_tests",
    "pass_at_k",
    "pass_at_k_table",
    "per_problem_rates",
    "rating_from_rank",
    "std_err",
    "truncation_share",
]
