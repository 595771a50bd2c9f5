"""Benchmark metrics from per-problem sample results, each with a bootstrap interval."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gspo_cli.eval.codeelo import codeelo_rating, load_standings_cache
from gspo_cli.eval.elo import elo_bootstrap_ci, elo_from_success_rates
from gspo_cli.eval.metrics import (
    avg_at_k,
    bootstrap_ci,
    bootstrap_statistic_ci,
    default_ks,
    length_stats,
    mean_maj_at_k,
    mean_pass_at_k,
    per_problem_rates,
    std_err,
)

CODEFORCES_ID = re.compile(r"^codeforces/(?P<contest>\d+)_(?P<index>\w+)$")


def answer_key(answer: str) -> str:
    """Votes for maj@k: "025", " 25" and "$25$" are one answer; integers compare as integers."""
    text = answer.strip().strip("$").replace(" ", "")
    try:
        return str(int(text))
    except ValueError:
        return text


def _metric(value: float, ci: tuple[float, float] | None) -> dict[str, float | None]:
    return {"value": value, "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None}


def summarize(records: Sequence[dict[str, Any]], k: int, kind: str, seed: int) -> dict[str, Any]:
    """avg@k, pass@k for every default k, maj@k (maths), lengths; intervals over problems."""
    counts = [sum(r["correct"]) for r in records]
    rates = per_problem_rates(counts, k)
    metrics: dict[str, Any] = {
        f"avg@{k}": _metric(avg_at_k(counts, k), bootstrap_ci(rates, seed=seed)),
        f"avg@{k}_std_err": std_err(rates) if len(rates) > 1 else None,
    }
    for kk in default_ks(k):
        ci = bootstrap_statistic_ci(counts, lambda cs, kk=kk: mean_pass_at_k(cs, k, kk), seed=seed)
        metrics[f"pass@{kk}"] = _metric(mean_pass_at_k(counts, k, kk), ci)
    if kind == "math":
        pairs = [(r["answers"], r["correct"]) for r in records]

        def maj(items: Sequence[tuple[list[str | None], list[bool]]]) -> float:
            return mean_maj_at_k([a for a, _ in items], [c for _, c in items], k, key=answer_key)

        metrics[f"maj@{k}"] = _metric(maj(pairs), bootstrap_statistic_ci(pairs, maj, seed=seed))
    metrics.update(form_metrics(records, k, seed))
    lengths = [n for r in records for n in r["lengths"]]
    stats = length_stats(lengths)
    metrics["response_len_mean"] = stats.mean
    metrics["response_len_max"] = stats.max
    metrics["response_len_p90"] = stats.p90
    metrics["truncated_frac"] = sum(t for r in records for t in r["truncated"]) / max(
        1, len(lengths)
    )
    return metrics


# Per-sample flags of a record (eval/scoring.py) -> the metric that averages them like avg@k.
FORM_METRICS = {
    "answered": "answered",
    "correct_any_form": "accuracy_any_form",
    "ran_clean": "ran_clean",
}


def form_metrics(records: Sequence[dict[str, Any]], k: int, seed: int) -> dict[str, Any]:
    """Answer form beside strict accuracy (rewards/answer_forms.py): `answered` (the expected
    form), `accuracy_any_form` (maths), `ran_clean` (code), each averaged as avg@k with the same
    bootstrap interval. Left out when a record lacks its flags (one written before they were)."""
    metrics: dict[str, Any] = {}
    for flags, name in FORM_METRICS.items():
        if not records or not all(flags in r for r in records):
            continue
        counts = [sum(r[flags]) for r in records]
        rates = per_problem_rates(counts, k)
        metrics[name] = _metric(avg_at_k(counts, k), bootstrap_ci(rates, seed=seed))
    return metrics


def codeforces_elo(
    records: Sequence[dict[str, Any]], k: int, standings: str | None, seed: int
) -> dict[str, Any]:
    """Elo by CodeElo (with a standings cache) or by the problem-rating MLE; names its method."""
    if standings:
        contests = load_standings_cache(standings)
        wanted = {c.id for c in contests}
        attempts: dict[str, dict[str, list[bool]]] = {}
        for r in records:
            match = CODEFORCES_ID.match(r["id"])
            if match and match["contest"] in wanted:
                attempts.setdefault(match["contest"], {})[match["index"]] = r["correct"][:8]
        if not attempts:
            return {
                "method": "codeelo: no evaluated problem belongs to a cached contest",
                "value": None,
            }
        result = codeelo_rating([c for c in contests if c.id in attempts], attempts)
        return {
            "method": "codeelo (rank among rated contestants, mean over contests)",
            "value": result.rating,
            "contests": len(result.contests),
            "attempts_per_problem": min(k, 8),
        }
    rated = [(r["rating"], sum(r["correct"]) / k) for r in records if r.get("rating") is not None]
    if not rated:
        return {
            "method": "none: the data has no problem ratings and no --standings cache was given",
            "value": None,
        }
    ratings, success = [float(a) for a, _ in rated], [b for _, b in rated]
    ci = elo_bootstrap_ci(ratings, success, seed=seed)
    return {
        "method": "problem-rating maximum likelihood",
        "problems": len(rated),
        **_metric(elo_from_success_rates(ratings, success), ci),
    }
