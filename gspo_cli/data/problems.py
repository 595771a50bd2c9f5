"""The uniform problem record, the cell readers every row parser shares, and the parsers of
the maths benchmarks' rows and of custom rows (the code benchmarks' are data/code_rows.py).

Every parser takes one data row (a dict, after column renaming) and its position, and returns a
`Problem`; a row it cannot use raises ValueError, which the loader turns into a GspoError naming
the file and row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

from gspo_cli.data.formats import SOLUTION_KEY, split_conversation
from gspo_cli.data.testcases import TestCase, parse_tests

Kind = Literal["math", "code"]


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    Maths problems have `answer` (the gold answer text, normalised per benchmark); code problems
    have `tests` (parsed test cases) and, for call-based problems, `starter_code`. The optional
    fields are filled when the data has them; everything else a row carries that may matter
    (solution, subject, time limit, source file) goes to `metadata`. `messages` is set when
    the problem is a conversation ({role, content} turns, asked as they are); `question` is
    then the text of its last user turn.
    """

    id: str
    benchmark: str
    kind: Kind
    question: str
    answer: str | None = None
    tests: tuple[TestCase, ...] | None = None
    starter_code: str = ""
    contest_date: date | None = None
    difficulty: str | None = None
    rating: int | None = None
    platform: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, Any], ...] | None = None


RowParser = Callable[[Mapping[str, Any], int, str], Problem]


def first(row: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of `names` present (and not None) in `row`, else None."""
    for name in names:
        if row.get(name) is not None:
            return row[name]
    return None


def text_of(row: Mapping[str, Any], *names: str) -> str:
    """The non-blank text of the first of `names` present; ValueError naming them when none."""
    value = first(row, *names)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"no text in any of the columns {list(names)}; has {sorted(row)}")
    return value


def level_of(value: Any) -> str | None:
    """A difficulty as text: 2.0 -> "2", "Level 3" -> "3", "easy" stays "easy"."""
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    match = re.fullmatch(r"Level (\d+)", str(value))
    return match.group(1) if match else str(value)


def date_of(value: Any) -> date | None:
    """A contest date from an ISO string ("2023-08-21T00:00:00"), a datetime or a date."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return datetime.fromisoformat(str(value)).date()
    except ValueError:
        raise ValueError(f"contest date {value!r} is not an ISO date") from None


def rating_of(value: Any) -> int | None:
    """A problem rating; 0 / missing means unknown (deepmind/code_contests uses 0)."""
    if value is None or value == "":
        return None
    rating = int(value)
    return rating if rating > 0 else None


def extra_of(row: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The fields of `names` that `row` fills: a problem's metadata."""
    return {n: row[n] for n in names if row.get(n) not in (None, "")}


# ----------------------------------------------------------------------------- maths

_AIME_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")


def aime_answer(value: Any) -> str:
    """AIME answers are integers 0..999; "025" and 25 both become "25"."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"AIME answer {value!r} is not an integer") from None
    if not 0 <= number <= 999:
        raise ValueError(f"AIME answer {number} is outside 0..999")
    return str(number)


def _aime_id(row: Mapping[str, Any], index: int, benchmark: str) -> str:
    """ "2024-I-1" from the AoPS url or year/aime_number/problem_number, else the row's id."""
    match = _AIME_URL.search(str(row.get("url") or ""))
    if match:
        return f"{match.group(1)}-{match.group(2)}-{match.group(3)}"
    if all(row.get(k) is not None for k in ("year", "aime_number", "problem_number")):
        number = int(row["problem_number"]) or 15  # deepscaler's copy numbers problem 15 as 0
        return f"{row['year']}-{'I' * int(row['aime_number'])}-{number}"
    raw = first(row, "id", "unique_id")
    return str(raw) if raw is not None else f"{benchmark}-{index}"


def parse_aime(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """AIME rows: problem/question text and an integer answer (leading zeros dropped)."""
    return Problem(
        id=_aime_id(row, index, benchmark),
        benchmark=benchmark,
        kind="math",
        question=text_of(row, "question", "problem", "Problem"),
        answer=aime_answer(first(row, "answer", "Answer")),
        difficulty=level_of(row.get("difficulty")),
        metadata=extra_of(row, "solution", "url", "year"),
    )


def _math_subject(row: Mapping[str, Any]) -> str | None:
    subject = row.get("subject")
    if subject:
        return str(subject)
    match = re.match(r"test/([^/]+)/", str(row.get("unique_id") or ""))
    return match.group(1) if match else None


def parse_math500(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """MATH-500 rows: problem, answer (LaTeX), level and unique_id ("test/<subject>/N.json")."""
    answer = first(row, "answer")
    if answer is None or str(answer).strip() == "":
        raise ValueError("no answer")
    subject = _math_subject(row)
    meta = extra_of(row, "solution") | ({"subject": subject} if subject else {})
    return Problem(
        id=str(first(row, "unique_id", "id") or f"{benchmark}-{index}"),
        benchmark=benchmark,
        kind="math",
        question=text_of(row, "problem", "question"),
        answer=str(answer),
        difficulty=level_of(first(row, "level", "difficulty")),
        metadata=meta,
    )


def gsm8k_answer(text: str) -> tuple[str, str]:
    """(final answer, worked solution) from a GSM8K answer "... #### 1,234" -> "1234"."""
    solution, sep, final = text.rpartition("####")
    if not sep:  # some copies keep only the final number
        solution, final = "", text
    final = final.strip().replace(",", "")
    if not final:
        raise ValueError(f"empty GSM8K answer in {text[-60:]!r}")
    return final, solution.strip()


def parse_gsm8k(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """GSM8K rows: question and the answer after "####" (thousands separators removed)."""
    final, solution = gsm8k_answer(text_of(row, "answer"))
    raw_id = first(row, "idx", "id")
    return Problem(
        id=str(raw_id) if raw_id is not None else f"{benchmark}-{index}",
        benchmark=benchmark,
        kind="math",
        question=text_of(row, "question", "problem"),
        answer=final,
        metadata={"solution": solution} if solution else {},
    )


# ----------------------------------------------------------------------------- custom

QUESTION_COLUMNS = ("question", "problem", "prompt")  # a custom row's question, first found
CUSTOM_FIELDS = (
    "id",
    "question",
    "messages",
    "answer",
    "tests",
    "starter_code",
    "contest_date",
    "difficulty",
    "rating",
)


def parse_custom(row: Mapping[str, Any], index: int, benchmark: str) -> Problem:
    """Any file whose columns were renamed to CUSTOM_FIELDS: `tests` makes it code, else maths.
    A conversational row (`_custom_question`) is asked as its turns, rendered at evaluation."""
    tests = tuple(parse_tests(row["tests"])) if row.get("tests") is not None else None
    answer = row.get("answer")
    if tests is None and (answer is None or str(answer).strip() == ""):
        raise ValueError(f"needs an 'answer' or 'tests' column (map one); has {sorted(row)}")
    raw_id = row.get("id")
    question, turns, target = _custom_question(row)
    return Problem(
        id=str(raw_id) if raw_id is not None else f"{benchmark}-{index}",
        benchmark=benchmark,
        kind="code" if tests is not None else "math",
        question=question,
        answer=None if tests is not None else str(answer),
        tests=tests,
        starter_code=str(row.get("starter_code") or ""),
        contest_date=date_of(row.get("contest_date")),
        difficulty=level_of(row.get("difficulty")),
        rating=rating_of(row.get("rating")),
        metadata={} if target is None else {SOLUTION_KEY: target},
        messages=turns,
    )


def _custom_question(
    row: Mapping[str, Any],
) -> tuple[str, tuple[dict[str, Any], ...] | None, str | None]:
    """(question, turns or None, final assistant turn or None) of a custom row. TRL's
    conversational rows (a `messages` column, or a question column holding {role, content}
    messages) are checked and split as training data are (data/formats.py); the question of a
    conversation is its last user turn. A text question wins over a `messages` column (sets
    such as NuminaMath-CoT ship both: the worked `messages` are not the question)."""
    question = first(row, *QUESTION_COLUMNS)
    if isinstance(question, str) or (question is None and row.get("messages") is None):
        return text_of(row, *QUESTION_COLUMNS), None, None  # `_text` says what is missing
    value = question if question is not None else row["messages"]
    prompt, target = split_conversation(value)
    if isinstance(prompt, str):  # a `messages` column that holds text: a plain question
        return text_of({"messages": prompt}, "messages"), None, None
    return _last_user_turn(prompt), tuple(prompt), target


def _last_user_turn(turns: list[dict[str, Any]]) -> str:
    """What a conversation asks, as its problem's `question` (a conversation is asked as its
    turns, never as this text)."""
    users = [str(turn["content"]) for turn in turns if turn["role"] == "user"]
    return users[-1] if users else str(turns[-1]["content"])
