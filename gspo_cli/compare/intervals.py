"""95% Student-t intervals over seeds, and the values a seed group shows in table cells.

The interval of n seed values is mean ± t(0.975, n - 1) · s / √n, with s the sample standard
deviation (n - 1 in the denominator). With one seed there is no interval: just the value.
t quantiles: a table for 1..30 degrees of freedom (checked against the regularised incomplete
beta function to 6 decimals), then the Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5),
within 3e-8 of the exact quantile from 30 degrees of freedom on. No scipy needed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# T975[df - 1]: the 0.975 quantile of Student's t with df degrees of freedom.
T975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
    2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922,
    2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
    2.048407, 2.045230, 2.042272,
)  # fmt: skip
Z975 = statistics.NormalDist().inv_cdf(0.975)


def t975(df: int) -> float:
    """The two-sided 95% critical value of Student's t with `df` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return float(z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4)


def half_width(values: Sequence[float]) -> float | None:
    """t(0.975, n - 1) · s / √n of the values; None for fewer than two."""
    if len(values) < 2:
        return None
    return t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class Estimate:
    """A number over the seeds of a group: their mean and 95% interval (None for one seed).

    Formats as `mean ± half-width` with the cell's format spec applied to both, so the table's
    cell functions show it unchanged ("{:.2%}" gives "15.00% ± 0.12%"). `brief` ones (secondary
    numbers inside a cell) show the mean only. n < seeds adds "(n/seeds seeds)".
    """

    mean: float
    ci_low: float | None
    ci_high: float | None
    n: int  # seeds with a value
    seeds: int  # seeds in the group
    brief: bool = False

    @classmethod
    def of(cls, values: Sequence[float], seeds: int, brief: bool = False) -> Estimate:
        mean = statistics.fmean(values)
        half = half_width(values)
        low, high = (None, None) if half is None else (mean - half, mean + half)
        return cls(mean, low, high, len(values), seeds, brief)

    def __format__(self, spec: str) -> str:
        spec = spec or ".4g"
        text = format(self.mean, spec)
        if not self.brief and self.ci_high is not None:
            text += " ± " + format(self.ci_high - self.mean, spec)
        if self.n < self.seeds:
            text += f" ({self.n}/{self.seeds} seeds)"
        return text


@dataclass(frozen=True)
class Spread:
    """Steps over seeds (a best step, steps done): formats as the one value, or `min–max`."""

    values: tuple[int, ...]

    def __format__(self, spec: str) -> str:
        low, high = min(self.values), max(self.values)
        return f"{low}" if low == high else f"{low}–{high}"
