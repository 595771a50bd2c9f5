"""The `reasoning_gym` reward: each task's own verifier (`score_answer`) on the model's answer.

The answer is the content of the completion's last `\\boxed{}` (what the default prompt
template asks for), else of its last `<answer>...</answer>` tag (reasoning-gym's own prompts);
`extract` picks one form only. The row's `reasoning_gym` column (data/reasoning_gym.py) holds
the task, its config and the entry its verifier reads. Scores are the verifier's, in [0, 1]:
some tasks give partial credit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from gspo_cli.data.reasoning_gym import ENTRY_COLUMN, TASK_COLUMN, scoring_dataset
from gspo_cli.rewards.extract import last_boxed
from gspo_cli.rewards.registry import REWARDS

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
Extract = Literal["auto", "boxed", "tag"]


def extract_answer(completion: str, extract: Extract = "auto") -> str | None:
    """The answer a completion gives (module docstring), stripped; None when it gives none."""
    answer = last_boxed(completion) if extract != "tag" else None
    if answer is None and extract != "boxed":
        tags = ANSWER_TAG.findall(completion)
        answer = tags[-1] if tags else None
    return None if answer is None else answer.strip()


def score_entry(answer: str | None, entry: Mapping[str, Any]) -> float:
    """The task's own score of `answer` for one row's entry; a verifier that fails on the
    model's answer scores it 0 (a malformed answer is a wrong one)."""
    if not isinstance(entry, Mapping) or not {"task", "config", "metadata"} <= entry.keys():
        raise ValueError(
            f"the {ENTRY_COLUMN!r} column holds {type(entry).__name__}, not a reasoning-gym "
            "entry: use a reasoning_gym: data source"
        )
    dataset = scoring_dataset(entry["task"], json.dumps(entry["config"], sort_keys=True))
    try:
        score = float(dataset.score_answer(answer, dict(entry)))
    except Exception:  # verifiers parse the answer and raise on many kinds of malformed text
        return 0.0
    return score if math.isfinite(score) else 0.0


@REWARDS.register("reasoning_gym")
def reasoning_gym_reward(
    completions: list[str], reasoning_gym: list[Any], *, extract: Extract = "auto"
) -> list[float]:
    """Each completion's answer scored by its task's own verifier (in [0, 1])."""
    return [
        score_entry(extract_answer(c, extract), entry)
        for c, entry in zip(completions, reasoning_gym, strict=True)
    ]


def task_means(
    label: str, scores: list[float | None], rows: list[dict[str, Any]]
) -> dict[str, float]:
    """`reward/<label>/<task>/mean` of one reward function over the completions of each
    reasoning-gym task (rows from other sources have none), as `reward/<label>/mean` is over
    all: a mix's tasks are told apart in the metrics."""
    by_task: dict[str, list[float]] = {}
    for score, row in zip(scores, rows, strict=True):
        task = row.get(TASK_COLUMN)
        if score is not None and isinstance(task, str) and ENTRY_COLUMN in row:
            by_task.setdefault(task, []).append(score)
    return {f"reward/{label}/{t}/mean": sum(v) / len(v) for t, v in sorted(by_task.items())}
