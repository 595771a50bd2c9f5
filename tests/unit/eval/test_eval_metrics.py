import json
import math
import random
import statistics
from fractions import Fraction
from pathlib import Path

import pytest

from gspo_cli.eval.codeelo import (
    Contest,
    ContestProblem,
    Participant,
    codeelo_rating,
    contest_result,
    load_standings_cache,
    rank_in_contest,
    score_icpc,
    score_points,
)
from gspo_cli.eval.elo import (
    ELO_MAX,
    ELO_MIN,
    elo_bootstrap_ci,
    elo_from_problem_ratings,
    elo_from_success_rates,
    expected_rank,
    rating_from_rank,
    win_probability,
)
from gspo_cli.eval.metrics import (
    avg_at_k,
    bootstrap_ci,
    default_ks,
    length_stats,
    maj_at_k,
    mean_maj_at_k,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_table,
    per_problem_rates,
    quantile,
    std_err,
    truncation_share,
)

# ----------------------------------------------------------------------------- pass@k


def test_pass_at_k_matches_combinatorial_formula() -> None:
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c"), [(1, 0), (1, 1), (8, 3), (32, 0), (32, 17), (64, 64)])
def test_pass_at_1_is_c_over_n(n: int, c: int) -> None:
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_large_n_is_stable() -> None:
    # C(1000, 500) overflows a float; the product form does not.
    value = pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998), rel=1e-9)
    assert pass_at_k(1000, 600, 500) == 1.0


@pytest.mark.parametrize(
    ("n", "c", "k"), [(4, 1, 5), (4, 5, 1), (-1, 0, 1), (4, -1, 1), (4, 1, -1)]
)
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_and_table() -> None:
    counts = [0, 1, 4, 8]
    assert mean_pass_at_k(counts, 8, 1) == pytest.approx((0 + 1 / 8 + 4 / 8 + 1) / 4)
    table = pass_at_k_table(counts, 8)
    assert list(table) == [1, 2, 4, 8]
    assert table[8] == pytest.approx(0.75)  # every problem with a correct sample
    assert all(a <= b for a, b in zip(table.values(), list(table.values())[1:], strict=False))
    assert list(pass_at_k_table(counts, 8, ks=[3, 1])) == [1, 3]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(1) == [1]
    with pytest.raises(ValueError, match="outside"):
        mean_pass_at_k([9], 8, 1)


def test_avg_at_k_rates_and_std_err() -> None:
    counts = [0, 2, 4, 3]
    assert per_problem_rates(counts, 4) == [0.0, 0.5, 1.0, 0.75]
    assert avg_at_k(counts, 4) == pytest.approx(2.25 / 4)
    rates = per_problem_rates(counts, 4)
    assert std_err(rates) == pytest.approx(statistics.stdev(rates) / 2)
    assert math.isnan(std_err([0.5]))
    with pytest.raises(ValueError):
        avg_at_k([], 4)


# ----------------------------------------------------------------------------- maj@k


def test_maj_at_k_majority_and_correctness() -> None:
    answers = ["3", "5", "5", "3", "5"]
    correct = [True, False, False, True, False]
    assert maj_at_k(answers, correct, 5) is False  # "5" wins 3-2 and is wrong
    assert maj_at_k(answers, correct, 1) is True  # only the first sample votes
    assert maj_at_k(answers, correct, 3) is False


def test_maj_at_k_tie_goes_to_earliest_answer() -> None:
    answers = ["7", "8", "8", "7"]
    assert maj_at_k(answers, [True, False, False, True], 4) is True
    assert maj_at_k(answers, [False, True, True, False], 4) is False
    assert maj_at_k(["8", "7", "7", "8"], [False, True, True, False], 4) is False


def test_maj_at_k_none_answers_do_not_vote() -> None:
    assert maj_at_k([None, None, "2"], [False, False, True], 3) is True
    assert maj_at_k([None, None], [False, False], 2) is False


def test_maj_at_k_uses_normaliser_or_equality() -> None:
    answers = ["1/2", "2", "2.0", "0.5", "0.50"]
    correct = [True, False, False, True, True]
    # Exact strings: five singletons; the tie goes to the first ("1/2", correct).
    assert maj_at_k(answers, correct, 5) is True
    # As numbers: {1/2, 0.5, 0.50} beats {2, 2.0} over 5 samples; over 4 it is a 2-2 tie and
    # the group seen first ("1/2") wins; over samples 2..4 the wrong "2" group wins.
    assert maj_at_k(answers, correct, 5, key=Fraction) is True
    assert maj_at_k(answers, correct, 4, key=Fraction) is True
    assert maj_at_k(answers[1:], correct[1:], 3, key=Fraction) is False

    def same(a: str, b: str) -> bool:
        return Fraction(a) == Fraction(b)

    reordered = ["2", "1/2", "2.0", "0.5", "0.50"]
    flags = [False, True, False, True, True]
    assert maj_at_k(reordered, flags, 5, same=same) is True
    assert maj_at_k(reordered, flags, 4, same=same) is False  # 2-2 tie, "2" seen first
    assert maj_at_k(reordered, flags, 4) is False  # exact strings: all singletons, "2" first
    with pytest.raises(ValueError, match="not both"):
        maj_at_k(answers, correct, 4, key=str, same=same)


def test_mean_maj_at_k() -> None:
    answers = [["1", "1", "2"], ["3", "4", "4"]]
    correct = [[True, True, False], [True, False, False]]
    assert mean_maj_at_k(answers, correct, 3) == 0.5
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True, False], 1)


# ----------------------------------------------------------------------------- intervals, lengths


def test_quantile_linear_interpolation() -> None:
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)
    assert quantile([7.0], 0.3) == 7.0


def test_bootstrap_ci_contains_mean_and_is_seeded() -> None:
    rng = random.Random(1)
    values = [rng.randint(0, 8) / 8 for _ in range(30)]
    mean = sum(values) / len(values)
    low, high = bootstrap_ci(values, seed=3)
    assert low < mean < high
    assert (low, high) == bootstrap_ci(values, seed=3)
    noisy = [rng.random() for _ in range(30)]
    assert bootstrap_ci(noisy, seed=3) != bootstrap_ci(noisy, seed=4)
    narrow = bootstrap_ci(values, seed=3, confidence=0.5)
    assert low <= narrow[0] <= narrow[1] <= high
    # Roughly mean +- 1.96 std-err for a sample this size.
    se = std_err(values)
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.25)
    assert bootstrap_ci([0.25] * 5) == (0.25, 0.25)


def test_length_stats_and_truncation() -> None:
    stats = length_stats([10, 20, 30, 40, 100], max_new_tokens=40)
    assert stats.mean == 40.0
    assert stats.max == 100
    assert stats.p50 == 30.0
    assert stats.p90 == pytest.approx(76.0)
    assert stats.truncated_share == pytest.approx(0.4)
    assert length_stats([5]).truncated_share is None
    assert truncation_share([True, False, False, False]) == 0.25


# ----------------------------------------------------------------------------- Elo from ratings


def test_elo_mle_hand_cases() -> None:
    assert elo_from_problem_ratings([1500.0, 1500.0], [True, False]) == pytest.approx(
        1500, abs=1e-4
    )
    # Symmetric around 1600: solve the easy one, miss the hard one.
    assert elo_from_problem_ratings([1400.0, 1800.0], [True, False]) == pytest.approx(
        1600, abs=1e-4
    )
    # P(solve) = 3/4 against a 1500 problem: R = 1500 + 400 log10(3).
    r = elo_from_problem_ratings([1500.0] * 4, [True, True, True, False])
    assert r == pytest.approx(1500 + 400 * math.log10(3), abs=1e-4)


def test_elo_mle_solves_score_equation() -> None:
    rng = random.Random(0)
    ratings = [float(rng.randrange(800, 3000, 100)) for _ in range(40)]
    solved = [rng.random() < 0.5 for _ in ratings]
    r = elo_from_problem_ratings(ratings, solved)
    expected = sum(win_probability(r, p) for p in ratings)
    assert expected == pytest.approx(sum(solved), abs=1e-6)


def test_elo_mle_clamps_and_is_monotonic() -> None:
    ratings = [1200.0, 1600.0, 2000.0, 2400.0]
    assert elo_from_problem_ratings(ratings, [True] * 4) == ELO_MAX
    assert elo_from_problem_ratings(ratings, [False] * 4) == ELO_MIN
    grown = [
        elo_from_problem_ratings(ratings, [i < n for i in range(4)]) for n in range(5)
    ]  # solve the easiest n problems
    assert grown == sorted(grown) and len(set(grown)) == 5
    # The number solved is a sufficient statistic: which problem was solved does not matter.
    assert elo_from_problem_ratings(ratings, [False, True, False, False]) == grown[1]
    with pytest.raises(ValueError):
        elo_from_problem_ratings(ratings, [True])


def test_elo_from_success_rates_matches_bool_case() -> None:
    ratings = [1500.0, 1500.0]
    assert elo_from_success_rates(ratings, [0.75, 0.25]) == pytest.approx(1500, abs=1e-4)
    assert elo_from_success_rates([1500.0], [0.5]) == pytest.approx(1500, abs=1e-4)
    with pytest.raises(ValueError, match="outside"):
        elo_from_success_rates([1500.0], [1.5])


def test_elo_bootstrap_ci_is_seeded_and_brackets_estimate() -> None:
    ratings = [float(r) for r in range(1000, 2600, 100)]
    rates = [1.0 if r < 1800 else 0.0 for r in ratings]
    rates[3], rates[10] = 0.0, 1.0
    point = elo_from_success_rates(ratings, rates)
    low, high = elo_bootstrap_ci(ratings, rates, resamples=200, seed=1)
    assert low < point < high
    assert (low, high) == elo_bootstrap_ci(ratings, rates, resamples=200, seed=1)


# ----------------------------------------------------------------------------- CodeElo


PROBLEMS = (ContestProblem("A", 500.0), ContestProblem("B", 1000.0))


def _contest(ratings: list[float], scores: list[float]) -> Contest:
    humans = tuple(Participant(s, 0.0, r) for s, r in zip(scores, ratings, strict=True))
    return Contest("1", "synthetic", "points", PROBLEMS, humans)


def test_rank_to_rating_middle_of_equal_field() -> None:
    # 10 humans rated 1500: ranked in the middle (m = 1 + 10/2), the model is rated 1500.
    assert expected_rank(1500.0, [1500.0] * 10) == 6.0
    assert rating_from_rank(6.0, [1500.0] * 10) == pytest.approx(1500.0, abs=1e-4)
    contest = _contest([1500.0] * 10, [1000, 900, 800, 700, 600, 400, 300, 200, 100, 0])
    result = contest_result(contest, {"A": [True]})  # 500 points, five humans ahead
    assert result.score == 500.0
    assert result.rank == 6.0
    assert result.rating == pytest.approx(1500.0, abs=1e-4)


def test_rank_to_rating_solves_equation_and_orders() -> None:
    rng = random.Random(2)
    ratings = [float(rng.randrange(900, 2800)) for _ in range(50)]
    for m in (1.5, 10.0, 25.5, 50.5):
        r = rating_from_rank(m, ratings)
        assert expected_rank(r, ratings) == pytest.approx(m, abs=1e-6)
    assert rating_from_rank(2.0, ratings) > rating_from_rank(40.0, ratings)
    # Beating everyone: above every human (the clamp), behind everyone: the floor.
    assert rating_from_rank(1.0, ratings) == ELO_MAX > max(ratings)
    assert rating_from_rank(51.0, ratings) == ELO_MIN
    with pytest.raises(ValueError, match="outside"):
        rating_from_rank(52.0, ratings)


def test_model_beating_everyone_rates_above_all() -> None:
    ratings = [1200.0, 1900.0, 2400.0]
    contest = _contest(ratings, [500, 1000, 1200])
    result = contest_result(contest, {"A": [True], "B": [True]})
    assert result.score == 1500.0 and result.rank == 1.0
    assert result.rating > max(ratings)


def test_points_scoring_penalties_floor_and_attempt_limit() -> None:
    contest = _contest([1500.0], [0])
    assert score_points(contest, {"A": [False, False, True]}) == 400.0
    assert score_points(contest, {"A": [False] * 7 + [True]}) == 150.0  # 500 - 350 = 30 % floor
    assert score_points(contest, {"B": [False] * 7 + [True]}) == 650.0
    assert score_points(contest, {"A": [False] * 8 + [True]}) == 0.0  # 9th attempt ignored
    assert score_points(contest, {"A": [False, False]}) == 0.0
    with pytest.raises(ValueError, match="unknown problem"):
        score_points(contest, {"Z": [True]})


def test_icpc_scoring_and_ranking() -> None:
    humans = (Participant(2.0, 50.0, 1500.0), Participant(1.0, 0.0, 1500.0))
    contest = Contest("1", "icpc", "icpc", PROBLEMS, (*humans, Participant(1.0, 30.0, 1500.0)))
    assert score_icpc(contest, {"A": [False, True], "B": [False]}) == (1, 10.0)
    # One solved with 10 penalty: behind the 2-solver and the 0-penalty 1-solver, ahead of 30.
    assert rank_in_contest(contest, 1.0, 10.0) == 3.0
    assert rank_in_contest(contest, 1.0, 0.0) == 2.5  # tie with the 0-penalty human


def test_codeelo_mean_over_contests() -> None:
    a = _contest([1500.0] * 4, [1000, 600, 400, 0])
    b = Contest("2", "b", "points", PROBLEMS, a.participants)
    result = codeelo_rating([a, b], {"1": {"A": [True]}, "2": {}})
    assert [c.contest_id for c in result.contests] == ["1", "2"]
    assert result.rating == pytest.approx(
        (result.contests[0].rating + result.contests[1].rating) / 2
    )
    assert result.contests[0].rating > result.contests[1].rating
    with pytest.raises(ValueError, match="unknown contest"):
        codeelo_rating([a], {"9": {}})


def test_standings_cache_round_trip_and_errors(tmp_path: Path) -> None:
    good = [
        {
            "id": 2000,
            "name": "Round",
            "problems": [{"index": "A", "points": 500}, {"index": "B", "points": 1000}],
            "participants": [{"score": 1500, "old_rating": 1700}, {"score": 0, "old_rating": 1200}],
        }
    ]
    path = tmp_path / "standings.json"
    path.write_text(json.dumps({"contests": good}))
    (contest,) = load_standings_cache(path)
    assert contest.id == "2000" and contest.type == "points"
    assert contest.participants[0] == Participant(1500.0, 0.0, 1700.0)

    bad = json.loads(json.dumps(good))
    bad[0]["participants"][1]["old_rating"] = "high"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"standings\.json.*participants\[1\]\.old_rating"):
        load_standings_cache(path)
    del bad[0]["problems"][0]["points"]
    bad[0]["participants"][1]["old_rating"] = 1200
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"problems\[0\]: missing 'points'"):
        load_standings_cache(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"standings\.json: not valid JSON"):
        load_standings_cache(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_standings_cache(tmp_path / "missing.json")


def test_majority_vote_treats_leading_zeros_as_one_answer() -> None:
    from gspo_cli.eval.summary import summarize

    record = {
        "answers": ["25", "25", "025", "025", "7", "7", "7"],
        "correct": [True, True, True, True, False, False, False],
        "lengths": [5] * 7,
        "truncated": [False] * 7,
    }
    assert summarize([record], 7, "math", 0)["maj@7"]["value"] == 1.0
