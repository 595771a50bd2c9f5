"""Codeforces-style Elo estimates: from problem ratings (MLE) and from a contest rank (CodeElo).

Two numbers, never to be mixed up in a report:

- Problem-rating MLE ("approximate Elo from problem ratings"): the rating R that maximises the
  likelihood of the observed solves under P(solve p) = 1 / (1 + 10^((rating_p - R)/400)).
  The score equation sum_p (s_p - P_p(R)) = 0 has a unique root when some but not all problems
  are solved; when all are solved (or none) the MLE is +infinity (-infinity), so every estimate
  is clamped to [ELO_MIN, ELO_MAX] = [0, 4000]: all solved gives 4000, none solved gives 0, and
  a finite root outside the range is clamped too.
- Rank-based rating (the CodeElo method, see `gspo_cli.eval.codeelo`): the R at which the
  expected rank among the contest's humans, 1 + sum_i 1 / (1 + 10^((R - r_i)/400)), equals the
  model's rank m. Solved by bisection in [ELO_MIN, ELO_MAX] with the same clamping.

Both solvers bisect a monotone function to `ELO_TOLERANCE` rating points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gspo_cli.eval.metrics import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, bootstrap_statistic_ci

ELO_MIN = 0.0
ELO_MAX = 4000.0
ELO_TOLERANCE = 1e-6
_MAX_ITERATIONS = 200


def win_probability(rating: float, opponent: float) -> float:
    """Elo probability that a player rated `rating` beats one rated `opponent` (400-point scale)."""
    return 1.0 / (1.0 + math.pow(10.0, (opponent - rating) / 400.0))


def _bisect_decreasing(
    f: Callable[[float], float], lo: float, hi: float, tol: float = ELO_TOLERANCE
) -> float:
    """Root of a non-increasing f on [lo, hi]; lo if f(lo) <= 0, hi if f(hi) >= 0 (clamping)."""
    if lo > hi:
        raise ValueError(f"empty search range [{lo}, {hi}]")
    if f(lo) <= 0.0:
        return lo
    if f(hi) >= 0.0:
        return hi
    for _ in range(_MAX_ITERATIONS):
        mid = 0.5 * (lo + hi)
        if hi - lo <= tol:
            return mid
        if f(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _check_ratings(ratings: Sequence[float], outcomes: Sequence[float]) -> None:
    if len(ratings) != len(outcomes):
        raise ValueError(f"{len(ratings)} ratings but {len(outcomes)} outcomes")
    if not ratings:
        raise ValueError("no attempted problems")
    for i, s in enumerate(outcomes):
        if not 0.0 <= s <= 1.0:
            raise ValueError(f"success rate {i} is {s}, outside [0, 1]")


def elo_from_success_rates(
    ratings: Sequence[float],
    rates: Sequence[float],
    *,
    lo: float = ELO_MIN,
    hi: float = ELO_MAX,
) -> float:
    """Problem-rating MLE with per-problem success fractions (e.g. c_p / k attempts).

    With the same number of attempts per problem this is the binomial MLE: the root of
    sum_p (rates[p] - P_p(R)) = 0, clamped to [lo, hi].
    """
    _check_ratings(ratings, rates)
    total = float(sum(rates))

    def excess(r: float) -> float:  # observed minus expected solves: decreasing in r
        return total - sum(win_probability(r, rp) for rp in ratings)

    return _bisect_decreasing(excess, lo, hi)


def elo_from_problem_ratings(ratings: list[float], solved: list[bool]) -> float:
    """Maximum-likelihood rating from solved / unsolved problems of known rating.

    All solved returns ELO_MAX and none solved returns ELO_MIN (the MLE is infinite there).
    """
    return elo_from_success_rates(ratings, [1.0 if s else 0.0 for s in solved])


def elo_bootstrap_ci(
    ratings: Sequence[float],
    rates: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap (low, high) interval of the problem-rating MLE, over problems.

    `rates` are per-problem success fractions (0.0 / 1.0 for a single attempt). Resamples in
    which every problem (or none) was solved hit the clamps, so the interval can touch them.
    """
    _check_ratings(ratings, rates)
    pairs = list(zip(ratings, rates, strict=True))

    def estimate(sample: Sequence[tuple[float, float]]) -> float:
        return elo_from_success_rates([r for r, _ in sample], [s for _, s in sample])

    return bootstrap_statistic_ci(
        pairs, estimate, resamples=resamples, confidence=confidence, seed=seed
    )


def expected_rank(rating: float, opponents: Sequence[float]) -> float:
    """Expected rank (1 = first) of a player rated `rating`: 1 + sum_i P(opponent i wins)."""
    return 1.0 + sum(win_probability(r, rating) for r in opponents)


def rating_from_rank(
    rank: float,
    opponents: Sequence[float],
    *,
    lo: float = ELO_MIN,
    hi: float = ELO_MAX,
) -> float:
    """The R with expected_rank(R, opponents) == rank, by bisection, clamped to [lo, hi].

    `rank` runs from 1 (ahead of everyone) to len(opponents) + 1 (behind everyone); the ends
    are reached only at infinite R, so they return the clamps.
    """
    if not opponents:
        raise ValueError("no rated opponents")
    if not 1.0 <= rank <= len(opponents) + 1:
        raise ValueError(f"rank {rank} is outside 1..{len(opponents) + 1}")
    return _bisect_decreasing(lambda r: expected_rank(r, opponents) - rank, lo, hi)
