from __future__ import annotations

from pathlib import Path

import pytest

from gspo_cli.recipe import Recipe, RecipeError, load_recipe
from tests.conftest import REPO

RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", RECIPES, ids=[str(p.relative_to(REPO)) for p in RECIPES])
def test_every_shipped_recipe_validates(path: Path) -> None:
    assert isinstance(load_recipe(path), Recipe)


def test_recipes_folder_is_searched_recursively() -> None:
    found = {p.relative_to(REPO / "recipes").as_posix() for p in RECIPES}
    assert "quickstart.yaml" in found
    # nested files: a glob that only reads the top folder would miss these
    assert {"code/codeforces-tiny.yaml", "deepspeed/tiny-cpu-zero2.yaml"} <= found


def test_paper_clip_defaults_follow_the_algorithm(tmp_path: Path) -> None:
    gspo = load_recipe(write(tmp_path, "a.yaml", "algorithm: {name: gspo}"))
    grpo = load_recipe(write(tmp_path, "b.yaml", "algorithm: {name: grpo}"))
    assert (gspo.algorithm.clip_low, gspo.algorithm.clip_high) == (3e-4, 4e-4)
    assert (grpo.algorithm.clip_low, grpo.algorithm.clip_high) == (0.2, 0.27)


def test_precedence_defaults_base_recipe_set(tmp_path: Path) -> None:
    write(
        tmp_path,
        "base.yaml",
        "name: base\nalgorithm: {clip_low: 0.1, clip_high: 0.1}\nrollout: {group_size: 4}\n",
    )
    child = write(
        tmp_path, "child.yaml", "base: base.yaml\nname: child\nalgorithm: {clip_high: 0.2}\n"
    )
    recipe = load_recipe(child, ["algorithm.clip_high=4e-4", "rollout.temperature=0.7"])
    assert recipe.name == "child"
    assert recipe.algorithm.clip_low == 0.1  # from base, merged key by key
    assert recipe.algorithm.clip_high == 4e-4  # --set wins over recipe
    assert recipe.rollout.group_size == 4 and recipe.rollout.temperature == 0.7
    assert recipe.rollout.num_prompts == Recipe().rollout.num_prompts  # default kept


def test_base_loop_is_reported(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(RecipeError, match="loop"):
        load_recipe(tmp_path / "a.yaml")


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "algorithm:\n  clip_hihg: 0.1\n",
            "algorithm.clip_hihg: unknown key; did you mean 'clip_high'?",
        ),
        (
            "rollout:\n  group_size: 1\n",
            "rollout.group_size: Input should be greater than or equal to 2",
        ),
        ("algorithm:\n  clip_low: -1\n", "algorithm.clip_low: Input should be greater than 0"),
        ("rollout:\n  num_prompts: abc\n", "rollout.num_prompts: Input should be a valid integer"),
        ("rollout: {num_prompts: 3, group_size: 3}\n", "algorithm.minibatches (4) must divide"),
        ("model:\n  path: ./no/such/model\n", "model.path: file not found: ./no/such/model"),
        ("data:\n  source: missing.jsonl\n", "data.source: file not found: missing.jsonl"),
        (
            "algorithm:\n  name: ppo\n",
            "algorithm.name: Input should be 'gspo', 'gspo_token' or 'grpo'",
        ),
        ("a: [1\nb: 2\n", "line 2: invalid YAML"),
        ("- 1\n- 2\n", "a recipe must be a mapping"),
    ],
)
def test_problems_name_the_key_path(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "bad.yaml", text))
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = "algorithm: {clip_low: -1, bogus: 1}\nrollout: {group_size: 1}\n"
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "bad.yaml", text))
    assert len(info.value.problems) == 3


def test_malformed_set_override(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"expected KEY\.PATH=VALUE"):
        load_recipe(write(tmp_path, "a.yaml", ""), ["algorithm.clip_high"])
    with pytest.raises(RecipeError, match="name is not a section"):
        load_recipe(write(tmp_path, "b.yaml", "name: run\n"), ["name.x=1"])


def test_every_field_is_documented() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += walk(ann)
        return missing

    assert walk(Recipe) == []
