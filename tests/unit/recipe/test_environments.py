"""The recipe's `environments`: each entry resolved into a validated view of the recipe, the
single-task recipe as its own one environment, and one line for every bad entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gspo_cli.recipe.environments import DEFAULT_ENVIRONMENT
from gspo_cli.recipe.loader import RecipeError, load_recipe, validate_recipe

ARITHMETIC = {
    "name": "arithmetic",
    "data": {"source": "builtin:arithmetic", "arithmetic": {"operators": "+-*"}},
}
CHAIN_SUM = {
    "name": "chain_sum",
    "weight": 0.5,
    "data": {"source": "reasoning_gym:chain_sum", "system_prompt": "Add."},
    "reward": [{"name": "reasoning_gym"}],
    "max_new_tokens": 16,
    "temperature": 0.6,
    "eval": {"num_problems": 7, "samples": 2},
    "cold_start": False,
}


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(RecipeError) as caught:
        validate_recipe(raw, "r.yaml")
    return str(caught.value)


def test_a_single_task_recipe_is_its_own_one_environment() -> None:
    recipe = validate_recipe({"rollout": {"max_new_tokens": 40}}, "r.yaml")
    (view,) = recipe.environments_resolved()
    assert (view.name, view.weight, view.cold_start) == (DEFAULT_ENVIRONMENT, 1.0, True)
    assert view.recipe is recipe  # no copy: the same code path reads the same object


def test_each_environment_reads_the_recipe_with_its_own_keys() -> None:
    raw = {
        "data": {"max_prompt_tokens": 100, "arithmetic": {"max_operand": 5}},
        "rollout": {"max_new_tokens": 40, "temperature": 0.9},
        "reward": {"timeout_s": 3.0},
        "environments": [ARITHMETIC, CHAIN_SUM],
    }
    arithmetic, chain_sum = validate_recipe(raw, "r.yaml").environments_resolved()
    assert arithmetic.recipe.data.source == "builtin:arithmetic"
    assert arithmetic.recipe.data.arithmetic.max_operand == 5  # the recipe's data keys stay
    assert arithmetic.recipe.data.arithmetic.operators == "+-*"  # its own, knob by knob
    assert arithmetic.recipe.rollout.max_new_tokens == 40
    assert [f.name for f in arithmetic.recipe.reward.functions] == ["math"]
    assert (chain_sum.weight, chain_sum.cold_start) == (0.5, False)
    view = chain_sum.recipe
    assert (view.data.source, view.data.system_prompt) == ("reasoning_gym:chain_sum", "Add.")
    assert view.data.max_prompt_tokens == 100 and view.rollout.temperature == 0.6
    assert arithmetic.recipe.rollout.temperature == 0.9
    assert view.rollout.max_new_tokens == 16 and view.reward.timeout_s == 3.0
    assert [f.name for f in view.reward.functions] == ["reasoning_gym"]
    assert (view.eval.num_problems, view.eval.samples) == (7, 2)
    assert view.environments == [] and view.rollout.tools is None


def test_tools_belong_to_the_environment_that_has_them() -> None:
    tools = {
        **ARITHMETIC,
        "name": "tools",
        "tools": {"interpreter": "python", "max_calls": 2, "output_max_tokens": 16},
    }
    plain, with_tools = validate_recipe(
        {"environments": [ARITHMETIC, tools]}, "r.yaml"
    ).environments_resolved()
    assert plain.recipe.tool_settings() is None
    settings = with_tools.recipe.tool_settings()
    assert settings is not None and settings.max_calls == 2


@pytest.mark.parametrize(
    ("environments", "top", "expected"),
    [
        ([ARITHMETIC, ARITHMETIC], {}, "two environments are named 'arithmetic'"),
        ([{**ARITHMETIC, "weight": 0}], {}, "every weight is 0"),
        ([{**ARITHMETIC, "weight_final": 0}], {}, "every weight_final is 0"),
        ([{**ARITHMETIC, "weight": -1}], {}, "environments.0.weight: Input should be greater"),
        ([{**ARITHMETIC, "name": "a b"}], {}, "environment name 'a b'"),
        ([{**ARITHMETIC, "data": {"seed": 3}}], {}, "data.seed is not a per-environment key"),
        ([ARITHMETIC], {"data": {"source": "builtin:arithmetic"}}, "data.source with envir"),
        (
            [ARITHMETIC],
            {"rollout": {"tools": {"interpreter": "python"}}},
            "rollout.tools with environments",
        ),
        (
            [{**ARITHMETIC, "data": {"source": "reasoning_gym:no_such_task"}}],
            {},
            "environment 'arithmetic': data: reasoning_gym: unknown task 'no_such_task'",
        ),
        (
            [{**ARITHMETIC, "max_new_tokens": 8}],
            {"reward": {"overlong_buffer": 16}},
            "environment 'arithmetic': recipe: reward.overlong_buffer (16) must be less",
        ),
        (
            [{**CHAIN_SUM, "name": "a"}, {**CHAIN_SUM, "name": "b"}],
            {"cold_start": {"enabled": True}},
            "every environment's cold_start false",
        ),
        ([{**ARITHMETIC, "id": "verifiers:wordle"}], {}, "verifiers environments are not"),
        ([{**ARITHMETIC, "id": "gym:CartPole"}], {}, "write openenv:module:app or openenv:http"),
        (
            [ARITHMETIC, CHAIN_SUM],
            {"reward": {"heldout_judge": {"every": 1, "options": {"model": "builtin:length"}}}},
            "heldout_judge judges one held-out set",
        ),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(
    environments: list[dict[str, Any]], top: dict[str, Any], expected: str
) -> None:
    message = _error({**top, "environments": environments})
    assert expected in message and "\n" not in message.strip()


def test_an_environments_data_file_is_found_next_to_the_recipe(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(
        "environments:\n  - name: mine\n    data: {source: rows.jsonl}\n  - name: builtin\n"
    )
    mine, _ = load_recipe(recipe_file).environments_resolved()
    assert mine.recipe.data.source == str(tmp_path / "rows.jsonl")
