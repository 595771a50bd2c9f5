"""reasoning-gym as a data source (`data.source: reasoning_gym:TASK`) and a reward
(`reasoning_gym`, the task's own `score_answer`): seeded rows, disjoint splits, weighted mixes,
scores equal to the verifier's, one-line errors for bad task names and config keys, and a short
`gspo train` run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
import yaml

from gspo_cli.core.errors import GspoError
from gspo_cli.data import reasoning_gym as rg_data
from gspo_cli.data.sources import load_rows, source_note
from gspo_cli.recipe import Recipe
from gspo_cli.rewards import REWARDS
from gspo_cli.rewards.reasoning_gym import (
    extract_answer,
    reasoning_gym_reward,
    task_means,
)
from gspo_cli.train.run.sft import cold_start, imitation_target
from tests.support.helpers import REPO, invoke_cli, one_error_line, run_cli, write_recipe

TINY = REPO / "recipes" / "reasoning-gym" / "tiny.yaml"
SMALL_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _data(source: str = "reasoning_gym:chain_sum", **rg: Any) -> Any:
    settings = {"config": SMALL_SUMS, "size": 300, "eval_size": 40, **rg}
    if "tasks" in rg:
        settings.pop("config")
    return Recipe.model_validate({"data": {"source": source, "reasoning_gym": settings}}).data


def _fresh_rows(data: Any, split: str) -> list[dict[str, Any]]:
    rg_data._splits.cache_clear()  # generated again, not read from the cache
    return load_rows(data.source, split, data)


def test_rows_are_generated_from_the_seed_and_carry_their_task() -> None:
    data = _data(seed=11)
    first, again = _fresh_rows(data, "train"), _fresh_rows(data, "train")
    assert first == again
    other = _fresh_rows(_data(seed=12), "train")
    assert [r["prompt"] for r in other] != [r["prompt"] for r in first]
    # the task's own dataset with that seed asks the same questions, in order
    made = reasoning_gym.create_dataset("chain_sum", **SMALL_SUMS, seed=11, size=300)
    held = {r["prompt"] for r in _fresh_rows(data, "test")}
    assert [r["prompt"] for r in first] == [
        e["question"] for e in made if e["question"] not in held
    ]
    row = first[0]
    assert row["task"] == row["reasoning_gym"]["task"] == "chain_sum"
    assert row["reasoning_gym"]["config"] == SMALL_SUMS
    assert row["answer"] == str(row["reasoning_gym"]["answer"])


def test_training_and_heldout_problems_never_overlap_and_the_drops_are_counted() -> None:
    data = _data(seed=3)  # 2 one-digit terms: few distinct sums, so many repeats to drop
    train, held = _fresh_rows(data, "train"), _fresh_rows(data, "test")
    questions = [r["prompt"] for r in held]
    assert len(set(questions)) == len(questions)
    assert not set(questions) & {r["prompt"] for r in train}
    overlap, repeats = 300 - len(train), 40 - len(held)
    assert overlap > 0  # the check is exercised, not vacuous
    note = source_note(data.source, "train", data)
    assert note is not None
    assert f"{overlap} of 300 training problems" in note
    assert f"{repeats} of 40 held-out problems" in note
    assert source_note(data.source, "test", data) == note


def test_a_generator_that_fails_far_into_the_size_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some tasks fail deep into a large `size` (one raised at problem 555,334 of 600,000): the
    error names the problem and the setting, not a traceback from reasoning-gym."""
    real = rg_data._mixed

    class FailsAtFive:
        def __init__(self, dataset: Any) -> None:
            self.dataset = dataset

        def __getitem__(self, i: int) -> Any:
            if i == 5:
                raise IndexError("list index out of range")
            return self.dataset[i]

    monkeypatch.setattr(rg_data, "_mixed", lambda *a: FailsAtFive(real(*a)))
    with pytest.raises(GspoError) as info:
        _fresh_rows(_data(seed=4), "train")
    assert str(info.value) == (
        "data: reasoning_gym chain_sum: the generator failed at problem 5 of 300 (IndexError: "
        "list index out of range); lower data.reasoning_gym.size"
    )
    rg_data._splits.cache_clear()


def test_a_composite_mixes_tasks_by_weight() -> None:
    tasks = {
        "chain_sum": {"weight": 3, "config": SMALL_SUMS},
        "basic_arithmetic": {"weight": 1, "config": {"max_terms": 3}},
    }
    data = _data("reasoning_gym:composite", tasks=tasks, size=2000, eval_size=20)
    rg_data._splits.cache_clear()
    # counted before the overlap is dropped: what the weights draw
    specs = rg_data.task_specs("composite", data.reasoning_gym)
    drawn = Counter(r["task"] for r in rg_data._rows("s", specs, data.seed, 2000, "train"))
    assert set(drawn) == {"chain_sum", "basic_arithmetic"}
    assert 0.70 < drawn["chain_sum"] / 2000 < 0.80  # 3:1 -> 0.75
    rows = _fresh_rows(data, "train")
    for row in rows[:50]:  # each row is scored by its own task's verifier
        entry = row["reasoning_gym"]
        assert entry["config"] == tasks[row["task"]]["config"]
        assert reasoning_gym_reward([f"\\boxed{{{row['answer']}}}"], [entry]) == [1.0]


def _score_answer(row: dict[str, Any], answer: str | None) -> float:
    entry = row["reasoning_gym"]
    made = reasoning_gym.create_dataset(entry["task"], **entry["config"])
    return float(made.score_answer(answer, entry))


@pytest.mark.parametrize(
    ("task", "config"),
    [("chain_sum", SMALL_SUMS), ("basic_arithmetic", {}), ("letter_counting", {})],
)
def test_the_reward_is_the_tasks_own_score(task: str, config: dict[str, Any]) -> None:
    data = Recipe.model_validate(
        {"data": {"source": f"reasoning_gym:{task}", "reasoning_gym": {"config": config}}}
    ).data
    rows = _fresh_rows(data, "test")[:10]
    entries = [r["reasoning_gym"] for r in rows]
    golds = [str(r["reasoning_gym"]["answer"]) for r in rows]
    wrong = [str(int(g) + 1) for g in golds]  # each task here has an integer answer
    right = reasoning_gym_reward([f"Working. \\boxed{{{g}}}" for g in golds], entries)
    assert right == [_score_answer(r, g) for r, g in zip(rows, golds, strict=True)]
    assert right == [1.0] * len(rows)
    tagged = reasoning_gym_reward([f"<answer>{w}</answer>" for w in wrong], entries)
    assert tagged == [_score_answer(r, w) for r, w in zip(rows, wrong, strict=True)]
    assert all(s < 1.0 for s in tagged)
    assert reasoning_gym_reward(["no answer here"] * len(rows), entries) == [0.0] * len(rows)


def test_the_answer_is_the_last_box_else_the_last_answer_tag() -> None:
    text = "<answer>1</answer> then \\boxed{2} and <answer>3</answer>"
    assert extract_answer(text) == "2"
    assert extract_answer(text, "tag") == "3"
    assert extract_answer("<answer> 4\n</answer>") == "4"
    assert extract_answer("<answer>4</answer>", "boxed") is None
    assert extract_answer("nothing") is None


def test_a_verifier_that_fails_on_a_malformed_answer_scores_zero() -> None:
    data = Recipe.model_validate({"data": {"source": "reasoning_gym:prime_factorization"}}).data
    row = _fresh_rows(data, "test")[0]
    with pytest.raises(ValueError):  # prime_factorization's verifier raises on text
        _score_answer(row, "not a number")
    entry = row["reasoning_gym"]
    assert reasoning_gym_reward(["\\boxed{not a number}"], [entry]) == [0.0]
    assert reasoning_gym_reward([f"\\boxed{{{row['answer']}}}"], [entry]) == [1.0]


def test_rewards_per_task_and_the_registered_name() -> None:
    assert REWARDS.get("reasoning_gym") is reasoning_gym_reward
    rows = [
        {"task": "a", "reasoning_gym": {}},
        {"task": "b", "reasoning_gym": {}},
        {"task": "a", "reasoning_gym": {}},
        {"task": "a"},  # not a reasoning-gym row: no per-task metric
    ]
    means = task_means("rg", [1.0, 0.0, 0.5, 1.0], rows)
    assert means == {"reward/rg/a/mean": 0.75, "reward/rg/b/mean": 0.0}
    assert task_means("rg", [None, None, None, None], rows) == {}


@pytest.mark.parametrize(
    ("setting", "parts"),
    [
        ("data.source=reasoning_gym:chain_summ", ("unknown task 'chain_summ'", "chain_sum")),
        (
            "data.reasoning_gym.config.max_term=3",
            ("chain_sum", "unknown config key 'max_term'", "'max_terms'", "valid keys: "),
        ),
        ("data.reasoning_gym.config.size=3", ("'size' is set by data.reasoning_gym.size",)),
        ("data.reasoning_gym.config.min_terms=0", ("chain_sum: bad config", "min_terms")),
        ("data.source=reasoning_gym:composite", ("composite needs reasoning_gym.tasks",)),
        ("data.reasoning_gym.tasks.chain_sum.weight=2", ("set data.source to reasoning_gym:",)),
        ("reward.functions.0.options.extract=box", ("extract",)),
    ],
)
def test_bad_tasks_and_keys_are_one_line_at_validate(setting: str, parts: tuple[str, ...]) -> None:
    one_error_line(invoke_cli("validate", str(TINY), "--set", setting), *parts)


def test_a_bad_task_inside_a_mix_names_it(tmp_path: Path) -> None:
    recipe = yaml.safe_load(TINY.read_text())
    recipe["data"]["source"] = "reasoning_gym:composite"
    recipe["data"]["reasoning_gym"] = {"tasks": {"chain_sum": {}, "basic_arithmatic": {}}}
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(recipe))
    one_error_line(invoke_cli("validate", str(path)), "'basic_arithmatic'", "basic_arithmetic")


def test_a_cold_start_can_imitate_the_boxed_answer_where_there_is_no_solution() -> None:
    rows = _fresh_rows(_data(seed=5), "train")[:3]
    assert [imitation_target(r, "answer") for r in rows] == [
        f"\\boxed{{{r['reasoning_gym']['answer']}}}" for r in rows
    ]
    assert imitation_target(rows[0], "solution") is None  # reasoning-gym rows have none
    settings = Recipe.model_validate({"cold_start": {"target": "solution"}}).cold_start
    with pytest.raises(GspoError, match=r"no 'solution' to imitate.*cold_start.target: answer"):
        cold_start(None, None, [[1]] * 3, rows, settings, 0)  # type: ignore[arg-type]
    settings = Recipe.model_validate({"cold_start": {"target": "answer"}}).cold_start
    for unboxable in ("", ["a", "b"], None):  # no gold answer; a list; none at all
        several = [rows[0], {**rows[0], "answer": unboxable}]
        with pytest.raises(GspoError, match=r"^cold_start: training row 1 has no single"):
            cold_start(None, None, [[1]] * 2, several, settings, 0)  # type: ignore[arg-type]
    code = [{**rows[0], "answer": "7", "tests": [{"input": "", "output": "7"}]}]
    with pytest.raises(GspoError, match=r"^cold_start: training row 0 has no single"):
        cold_start(None, None, [[1]], code, settings, 0)  # type: ignore[arg-type]


def test_the_shipped_recipe_validates() -> None:
    result = invoke_cli("validate", str(TINY))
    assert result.returncode == 0, result.stderr
    assert "reasoning_gym:chain_sum" in result.stdout


@pytest.mark.slow
def test_a_short_training_run_after_an_answer_cold_start_logs_rewards_per_task(
    tmp_path: Path,
) -> None:
    recipe = write_recipe(
        tmp_path,
        {
            "data": {
                "source": "reasoning_gym:composite",
                "reasoning_gym": {
                    "tasks": {"chain_sum": {"config": SMALL_SUMS}, "basic_arithmetic": {}},
                    "size": 200,
                    "eval_size": 8,
                },
            },
            "reward": {"functions": [{"name": "reasoning_gym"}]},
            "cold_start": {"enabled": True, "steps": 2, "batch_size": 4, "target": "answer"},
            "trainer": {"steps": 2},
        },
    )
    out = tmp_path / "run"
    result = run_cli("train", str(recipe), "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward/reasoning_gym/mean" in s]
    assert len(steps) == 2
    per_task = {k for s in steps for k in s if k.startswith("reward/reasoning_gym/")}
    assert per_task <= {
        "reward/reasoning_gym/mean",
        "reward/reasoning_gym/chain_sum/mean",
        "reward/reasoning_gym/basic_arithmetic/mean",
    }
    assert len(per_task) >= 2  # the overall mean and at least one task's
