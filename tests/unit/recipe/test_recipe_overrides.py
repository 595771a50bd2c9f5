"""`--set` merges a mapping key by key as `base:` does and indexes lists by number; a bare
`model.path` names a folder next to the recipe when there is one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_cli.recipe import RecipeError, load_recipe


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_set_of_a_section_merges_key_by_key_like_base(tmp_path: Path) -> None:
    recipe = write(tmp_path, "eval: {num_problems: 7, samples: 3}\n")
    loaded = load_recipe(recipe, ["eval={every: 2}"])
    assert (loaded.eval.every, loaded.eval.num_problems, loaded.eval.samples) == (2, 7, 3)
    nested = load_recipe(recipe, ["rollout={vllm: {sync: reload}}", "rollout.vllm={sleep: false}"])
    assert (nested.rollout.vllm.sync, nested.rollout.vllm.sleep) == ("reload", False)


def test_set_indexes_a_list_by_number(tmp_path: Path) -> None:
    two = write(tmp_path, "reward:\n  functions: [{name: math}, {name: math, weight: 0.5}]\n")
    loaded = load_recipe(two, ["reward.functions.1.weight=2", "reward.functions.0={weight: 3}"])
    assert [f.weight for f in loaded.reward.functions] == [3.0, 2.0]
    assert [f.name for f in loaded.reward.functions] == ["math", "math"]  # merged, not replaced
    # A list the recipe does not write is the schema's default list, indexed the same way.
    default = load_recipe(write(tmp_path, "name: r\n"), ["reward.functions.0.weight=2"])
    assert [(f.name, f.weight) for f in default.reward.functions] == [("math", 2.0)]


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "reward.functions.3.weight=2",
            "reward.functions has 1 item(s), so index 3 is out of range; to add one, write the "
            "whole list: reward.functions=[{...}, {...}]",
        ),
        ("reward.functions.first.weight=2", "reward.functions is a list: index it by number"),
        ("eval.0=1", "eval is not a list"),
        ("name.x=1", "name is not a section"),
    ],
)
def test_a_bad_set_path_says_how_to_write_it(tmp_path: Path, override: str, expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "name: r\n"), [override])
    [line] = info.value.problems
    assert line.startswith(f"--set {override!r}: {expected}"), line


def test_a_bare_model_path_is_a_folder_next_to_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipes = tmp_path / "recipes"
    (recipes / "mymodel").mkdir(parents=True)
    (recipes / "mymodel" / "config.json").write_text('{"model_type": "qwen3"}')
    (recipes / "org" / "name").mkdir(parents=True)
    (recipes / "org" / "name" / "config.json").write_text('{"model_type": "qwen3"}')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the recipe, not to the working directory
    for bare in ("mymodel", "org/name"):
        loaded = load_recipe(write(recipes, f"model: {{path: {bare}}}\n"))
        assert loaded.model.path == str(recipes / bare)
    hub = load_recipe(write(recipes, "model: {path: someorg/somemodel}\n"))
    assert hub.model.path == "someorg/somemodel"  # no such folder: a hub id


def test_a_bare_folder_without_config_json_is_refused_at_validate(tmp_path: Path) -> None:
    (tmp_path / "mymodel").mkdir()
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "model: {path: mymodel}\n"))
    assert info.value.problems == [
        f"model.path: {tmp_path / 'mymodel'} is a folder without config.json, not an HF checkpoint"
    ]


def test_reward_and_judge_models_are_read_from_the_recipes_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reward model's or judge's `model` is a path relative to the recipe, as `model.path`
    is (it was read from the working folder, and failed as a malformed hub id)."""
    recipes = tmp_path / "recipes"
    for folder, labels in (("rm", 1), ("judge-lm", 2)):
        (recipes / folder).mkdir(parents=True)
        (recipes / folder / "config.json").write_text(
            f'{{"model_type": "qwen3", "num_labels": {labels}}}'
        )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = (
        "reward:\n"
        "  functions:\n"
        "    - {name: math}\n"
        "    - {name: reward_model, weight: 0.5, options: {model: ./rm}}\n"
        "    - {name: judge, weight: 0.5, none_as: skip, options: {model: judge-lm}}\n"
        "  heldout_judge: {every: 5, options: {model: ../recipes/judge-lm}}\n"
    )
    loaded = load_recipe(write(recipes, text))
    options = [f.options.get("model") for f in loaded.reward.functions]
    assert options == [None, str(recipes / "rm"), str(recipes / "judge-lm")]
    assert loaded.reward.heldout_judge is not None
    assert loaded.reward.heldout_judge.options["model"] == str(recipes / "judge-lm")
    url = "reward:\n  functions: [{name: judge, none_as: skip, options: {model: 'http://localhost:8000/v1'}}]\n"
    assert load_recipe(write(recipes, url)).reward.functions[0].options["model"].startswith("http")
