"""Evaluation metrics over sampled responses: pass@k, avg@k, maj@k, intervals, length statistics.

Conventions (see docs/eval-metrics.md):

- `counts[j]` is c_j, the number of correct samples for problem j, out of `n` samples per problem.
- avg@k is the mean over problems of c_j / k ("pass@1 averaged over k samples").
- pass@k is the unbiased estimator of Chen et al. (2021), averaged over problems.
- maj@k counts a problem as solved when the most frequent extracted answer among its first k
  samples is correct (see `maj_at_k` for grouping and ties).
- Intervals are over problems: a seeded percentile bootstrap, or the standard error of c_j / k.

Everything here is pure Python and deterministic given its inputs (and seed).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

DEFAULT_RESAMPLES = 1000
DEFAULT_CONFIDENCE = 0.95


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or k < 0:
        raise ValueError(f"n, c and k must be non-negative (got n={n}, c={c}, k={k})")
    if c > n:
        raise ValueError(f"c must be <= n (got c={c}, n={n})")
    if k > n:
        raise ValueError(f"k must be <= n (got k={k}, n={n})")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `c` correct out of `n` samples (Chen et al., 2021).

    Equals 1 - C(n-c, k) / C(n, k), computed in the stable product form
    1 - prod_{i=n-c+1..n} (1 - k/i); it is 1.0 when n - c < k. pass@1 == c / n.
    Raises ValueError for negative arguments, c > n or k > n. k = 0 gives 0.0 (nothing drawn).
    """
    _check_counts(n, c, k)
    if k == 0:
        return 0.0
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _check_problem_counts(counts: Sequence[int], n: int) -> None:
    if not counts:
        raise ValueError("no problems: counts is empty")
    for j, c in enumerate(counts):
        if c < 0 or c > n:
            raise ValueError(f"counts[{j}] = {c} is outside 0..{n}")


def mean_pass_at_k(counts: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over problems; every problem has `n` samples, `counts[j]` correct."""
    _check_problem_counts(counts, n)
    return math.fsum(pass_at_k(n, c, k) for c in counts) / len(counts)


def default_ks(n: int) -> list[int]:
    """The k values reported by default: 1, 2, 4, 8, ... up to n, plus n itself."""
    if n < 1:
        raise ValueError(f"need at least one sample per problem (got n={n})")
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def pass_at_k_table(
    counts: Sequence[int], n: int, ks: Iterable[int] | None = None
) -> dict[int, float]:
    """{k: mean pass@k} for each k in `ks` (default `default_ks(n)`: powers of two and n)."""
    chosen = default_ks(n) if ks is None else sorted(set(ks))
    return {k: mean_pass_at_k(counts, n, k) for k in chosen}


def per_problem_rates(counts: Sequence[int], k: int) -> list[float]:
    """c_j / k for each problem: the per-problem accuracy that avg@k averages."""
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    _check_problem_counts(counts, k)
    return [c / k for c in counts]


def avg_at_k(counts: Sequence[int], k: int) -> float:
    """avg@k = (1/N) * sum_j c_j / k, with `counts[j]` correct among k samples of problem j."""
    rates = per_problem_rates(counts, k)
    return math.fsum(rates) / len(rates)


def _group_answers(
    answers: Sequence[str | None],
    key: Callable[[str], Hashable] | None,
    same: Callable[[str, str], bool] | None,
) -> list[list[int]]:
    """Sample indices grouped by equal answer, groups in order of first appearance; None skipped.

    With `same`, each answer joins the first group whose first member it matches, so a
    non-transitive equality (Math-Verify) still gives one deterministic grouping.
    """
    groups: list[list[int]] = []
    if same is not None:
        for i, ans in enumerate(answers):
            if ans is None:
                continue
            for group in groups:
                rep = answers[group[0]]
                if rep is not None and same(rep, ans):
                    group.append(i)
                    break
            else:
                groups.append([i])
        return groups
    by_key: dict[Hashable, list[int]] = {}
    for i, ans in enumerate(answers):
        if ans is None:
            continue
        k = key(ans) if key is not None else ans
        if k not in by_key:
            by_key[k] = []
            groups.append(by_key[k])
        by_key[k].append(i)
    return groups


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    *,
    key: Callable[[str], Hashable] | None = None,
    same: Callable[[str, str], bool] | None = None,
) -> bool:
    """maj@k for one problem: is the most frequent answer among the first k samples correct?

    `answers[i]` is sample i's extracted answer (None when nothing was extracted; such samples
    do not vote) and `correct[i]` whether the checker accepted it. Answers are grouped by
    `key(answer)` (a normaliser) or by `same(a, b)` (an equality such as Math-Verify's; give at
    most one of the two; default: exact string equality). The biggest group wins; a tie goes to
    the group whose first sample comes earliest. The majority is correct iff some sample of the
    winning group was judged correct. No extracted answer at all counts as wrong.
    """
    if key is not None and same is not None:
        raise ValueError("give key or same, not both")
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness flags")
    if k < 1 or k > len(answers):
        raise ValueError(f"k must be in 1..{len(answers)} (got {k})")
    groups = _group_answers(answers[:k], key, same)
    if not groups:
        return False
    # max() keeps the first of equal-sized groups, and groups are in first-appearance order.
    winner = max(groups, key=len)
    return any(correct[i] for i in winner)


def mean_maj_at_k(
    answers: Sequence[Sequence[str | None]],
    correct: Sequence[Sequence[bool]],
    k: int,
    *,
    key: Callable[[str], Hashable] | None = None,
    same: Callable[[str, str], bool] | None = None,
) -> float:
    """maj@k averaged over problems; `answers[j]` / `correct[j]` are problem j's samples."""
    if not answers:
        raise ValueError("no problems: answers is empty")
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} problems of answers but {len(correct)} of correctness")
    solved = [maj_at_k(a, c, k, key=key, same=same) for a, c in zip(answers, correct, strict=True)]
    return sum(solved) / len(solved)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("quantile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1] (got {q})")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def bootstrap_statistic_ci(
    items: Sequence[T],
    statistic: Callable[[Sequence[T]], float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap (low, high) interval of `statistic` over resampled `items`.

    Each of `resamples` rounds draws len(items) items with replacement (random.Random(seed)),
    so the same inputs and seed always give the same interval.
    """
    if not items:
        raise ValueError("bootstrap over an empty sequence")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1 (got {resamples})")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    rng = random.Random(seed)
    stats = [statistic(rng.choices(items, k=len(items))) for _ in range(resamples)]
    alpha = 1.0 - confidence
    return quantile(stats, alpha / 2), quantile(stats, 1.0 - alpha / 2)


def bootstrap_ci(
    values: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of per-problem `values` (e.g. c_j / k)."""
    return bootstrap_statistic_ci(
        values, _mean, resamples=resamples, confidence=confidence, seed=seed
    )


def std_err(values: Sequence[float]) -> float:
    """Standard error of the mean of per-problem values: sample std (N - 1) / sqrt(N).

    Use it on `per_problem_rates(counts, k)`. One problem gives NaN (the spread is unknown).
    """
    if not values:
        raise ValueError("standard error of an empty sequence")
    if len(values) == 1:
        return math.nan
    return statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class LengthStats:
    """Response-length summary (lengths in tokens, or whatever unit the caller used)."""

    count: int
    mean: float
    max: int
    p50: float
    p90: float
    truncated_share: float | None  # share reaching max_new_tokens; None when not given


def truncation_share(truncated: Sequence[bool]) -> float:
    """Share of responses cut off by the length limit (e.g. finish_reason == "length")."""
    if not truncated:
        raise ValueError("truncation share of an empty sequence")
    return sum(truncated) / len(truncated)


def length_stats(lengths: Sequence[int], max_new_tokens: int | None = None) -> LengthStats:
    """Mean, max, median and 90th percentile of response lengths.

    With `max_new_tokens`, a response of at least that length counts as truncated.
    """
    if not lengths:
        raise ValueError("length statistics of an empty sequence")
    floats = [float(x) for x in lengths]
    share = None
    if max_new_tokens is not None:
        share = truncation_share([x >= max_new_tokens for x in lengths])
    return LengthStats(
        count=len(lengths),
        mean=_mean(floats),
        max=max(lengths),
        p50=quantile(floats, 0.5),
        p90=quantile(floats, 0.9),
        truncated_share=share,
    )
