"""CodeElo (Quan et al., 2025): the model as a contestant in rated Codeforces contests.

Per contest: (a) score the model from its attempts (up to MAX_ATTEMPTS per problem), (b) find
its rank m among the contest's rated humans, (c) solve m = 1 + sum_i 1 / (1 + 10^((R - r_i)/400))
for R by bisection (`gspo_cli.eval.elo.rating_from_rank`, clamped to [0, 4000]), and (d) report
the mean of R over contests. Nothing is fetched: standings come from a local cache file.

Scoring (the model submits everything at time 0, so there is no time decay):

- "points" contests: a problem solved after w rejected attempts scores
  max(points - 50 * w, 0.3 * points) (Codeforces' floor of 30 %); unsolved problems score 0.
  Humans are ranked by score only.
- "icpc" contests (Div. 3, Educational): (solved, penalty) with 10 penalty minutes per rejected
  attempt before an accepted one; more solved is better, then less penalty.

Only the first MAX_ATTEMPTS attempts of a problem count. A human with exactly the model's result
counts as half ahead: m = 1 + (#humans strictly ahead) + (#humans tied) / 2.

Standings cache format (JSON). The top level is a list of contests, or {"contests": [...]}:

    [
      {
        "id": 2000,                      # int or string, required
        "name": "Codeforces Round ...",  # optional
        "type": "points",                # "points" (default) or "icpc"
        "problems": [{"index": "A", "points": 500}, ...],    # points required for "points"
        "participants": [                # the rated humans only (contest.ratingChanges)
          {"score": 1234.0, "penalty": 0, "old_rating": 1500}, ...
        ]
      }
    ]

`score` is the final points (or the number solved for "icpc"), `penalty` is optional (default 0,
used by "icpc" only) and `old_rating` is the pre-contest rating. The cache is built once from the
Codeforces API (contest.standings + contest.ratingChanges) by whoever has network access.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gspo_cli.eval.elo import ELO_MAX, ELO_MIN, rating_from_rank

MAX_ATTEMPTS = 8
REJECT_PENALTY_POINTS = 50.0
MIN_POINTS_FRACTION = 0.3
ICPC_PENALTY_MINUTES = 10.0

ContestType = Literal["points", "icpc"]


@dataclass(frozen=True)
class ContestProblem:
    """One problem of a contest: its index ("A", "B1", ...) and maximum points (0 for icpc)."""

    index: str
    points: float


@dataclass(frozen=True)
class Participant:
    """One rated human: final score (points, or solved count for icpc), penalty, old rating."""

    score: float
    penalty: float
    old_rating: float


@dataclass(frozen=True)
class Contest:
    """A rated contest with its problems and rated participants."""

    id: str
    name: str
    type: ContestType
    problems: tuple[ContestProblem, ...]
    participants: tuple[Participant, ...]


@dataclass(frozen=True)
class ContestResult:
    """The model's outcome in one contest: its score, penalty, rank m and rating R."""

    contest_id: str
    score: float
    penalty: float
    rank: float
    rating: float


@dataclass(frozen=True)
class CodeEloResult:
    """Mean rating over contests (the CodeElo figure) and the per-contest results."""

    rating: float
    contests: tuple[ContestResult, ...]


def _first_accept(attempts: Sequence[bool], max_attempts: int) -> int | None:
    """Number of rejected attempts before the first accepted one, or None if never accepted."""
    for i, ok in enumerate(attempts[:max_attempts]):
        if ok:
            return i
    return None


def _check_attempts(contest: Contest, attempts: Mapping[str, Sequence[bool]]) -> None:
    known = {p.index for p in contest.problems}
    unknown = sorted(set(attempts) - known)
    if unknown:
        raise ValueError(f"contest {contest.id}: unknown problem(s) {unknown}; has {sorted(known)}")


def score_points(
    contest: Contest,
    attempts: Mapping[str, Sequence[bool]],
    *,
    max_attempts: int = MAX_ATTEMPTS,
    reject_penalty: float = REJECT_PENALTY_POINTS,
    min_fraction: float = MIN_POINTS_FRACTION,
) -> float:
    """Points of the model: per solved problem max(points - penalty * rejected, floor)."""
    _check_attempts(contest, attempts)
    total = 0.0
    for problem in contest.problems:
        rejected = _first_accept(attempts.get(problem.index, ()), max_attempts)
        if rejected is not None:
            earned = problem.points - reject_penalty * rejected
            total += max(earned, min_fraction * problem.points)
    return total


def score_icpc(
    contest: Contest,
    attempts: Mapping[str, Sequence[bool]],
    *,
    max_attempts: int = MAX_ATTEMPTS,
    penalty_minutes: float = ICPC_PENALTY_MINUTES,
) -> tuple[int, float]:
    """(solved, penalty) of the model, all submissions at minute 0."""
    _check_attempts(contest, attempts)
    solved, penalty = 0, 0.0
    for problem in contest.problems:
        rejected = _first_accept(attempts.get(problem.index, ()), max_attempts)
        if rejected is not None:
            solved += 1
            penalty += penalty_minutes * rejected
    return solved, penalty


def _compare(contest: Contest, human: Participant, score: float, penalty: float) -> int:
    """+1 if the human is ahead of the model, 0 if tied, -1 if behind."""
    if human.score != score:
        return 1 if human.score > score else -1
    if contest.type == "icpc" and human.penalty != penalty:
        return 1 if human.penalty < penalty else -1
    return 0


def rank_in_contest(contest: Contest, score: float, penalty: float = 0.0) -> float:
    """m = 1 + (#humans ahead) + (#humans tied) / 2, among the contest's rated participants."""
    ahead = tied = 0
    for human in contest.participants:
        cmp = _compare(contest, human, score, penalty)
        ahead += cmp == 1
        tied += cmp == 0
    return 1.0 + ahead + tied / 2.0


def contest_result(
    contest: Contest,
    attempts: Mapping[str, Sequence[bool]],
    *,
    max_attempts: int = MAX_ATTEMPTS,
    lo: float = ELO_MIN,
    hi: float = ELO_MAX,
) -> ContestResult:
    """Score, rank and rating of the model in one contest from its per-problem attempts.

    `attempts[index]` lists the verdicts (True = accepted) of the model's submissions to that
    problem in order; problems left out count as unsolved.
    """
    if contest.type == "icpc":
        solved, penalty = score_icpc(contest, attempts, max_attempts=max_attempts)
        score = float(solved)
    else:
        score, penalty = score_points(contest, attempts, max_attempts=max_attempts), 0.0
    rank = rank_in_contest(contest, score, penalty)
    ratings = [p.old_rating for p in contest.participants]
    rating = rating_from_rank(rank, ratings, lo=lo, hi=hi)
    return ContestResult(contest.id, score, penalty, rank, rating)


def codeelo_rating(
    contests: Sequence[Contest],
    attempts: Mapping[str, Mapping[str, Sequence[bool]]],
    *,
    max_attempts: int = MAX_ATTEMPTS,
) -> CodeEloResult:
    """CodeElo: the mean over contests of the rank-based rating.

    `attempts[contest_id][problem_index]` are the model's verdicts; every contest in
    `contests` is used (a contest missing from `attempts` means nothing was solved).
    """
    if not contests:
        raise ValueError("no contests")
    ids = {c.id for c in contests}
    unknown = sorted(set(attempts) - ids)
    if unknown:
        raise ValueError(f"attempts for unknown contest(s) {unknown}")
    results = tuple(
        contest_result(c, attempts.get(c.id, {}), max_attempts=max_attempts) for c in contests
    )
    return CodeEloResult(math.fsum(r.rating for r in results) / len(results), results)


# ----------------------------------------------------------------------------- cache loading


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _field(obj: Any, name: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    if name not in obj:
        raise ValueError(f"{where}: missing {name!r}")
    return obj[name]


def _parse_problem(obj: Any, where: str, ctype: ContestType) -> ContestProblem:
    index = _field(obj, "index", where)
    if not isinstance(index, str) or not index:
        raise ValueError(f"{where}.index: expected a non-empty string, got {index!r}")
    if ctype == "icpc":
        points = _number(obj.get("points", 0), f"{where}.points")
    else:
        points = _number(_field(obj, "points", where), f"{where}.points")
    return ContestProblem(index, points)


def _parse_participant(obj: Any, where: str) -> Participant:
    score = _number(_field(obj, "score", where), f"{where}.score")
    penalty = _number(obj.get("penalty", 0), f"{where}.penalty")
    rating = _number(_field(obj, "old_rating", where), f"{where}.old_rating")
    return Participant(score, penalty, rating)


def _list(obj: Any, name: str, where: str) -> list[Any]:
    value = _field(obj, name, where)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}.{name}: expected a non-empty list")
    return value


def parse_contest(obj: Any, where: str) -> Contest:
    """One contest from its JSON object; errors name `where` and the bad field."""
    cid = _field(obj, "id", where)
    if not isinstance(cid, int | str) or isinstance(cid, bool):
        raise ValueError(f"{where}.id: expected an int or string, got {cid!r}")
    where = f"{where} (id {cid})"
    ctype = obj.get("type", "points")
    if ctype not in ("points", "icpc"):
        raise ValueError(f"{where}.type: expected 'points' or 'icpc', got {ctype!r}")
    problems = tuple(
        _parse_problem(p, f"{where}.problems[{i}]", ctype)
        for i, p in enumerate(_list(obj, "problems", where))
    )
    indices = [p.index for p in problems]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{where}.problems: duplicate index in {indices}")
    participants = tuple(
        _parse_participant(p, f"{where}.participants[{i}]")
        for i, p in enumerate(_list(obj, "participants", where))
    )
    name = obj.get("name", "")
    return Contest(str(cid), str(name), ctype, problems, participants)


def load_standings_cache(path: str | Path) -> list[Contest]:
    """Read a standings cache (format in the module docstring); ValueError names file and field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read standings cache: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if isinstance(data, dict):
        data = _field(data, "contests", f"{path}")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of contests")
    contests = [parse_contest(c, f"{path}: contests[{i}]") for i, c in enumerate(data)]
    ids = [c.id for c in contests]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate contest ids in {ids}")
    return contests
