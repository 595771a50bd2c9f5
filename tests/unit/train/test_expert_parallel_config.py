"""`deepspeed.expert_parallel` (AutoEP): the DeepSpeed section it derives and what it refuses,
each in one line (tests/integration/train/test_expert_parallel.py trains with it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe import Recipe, RecipeError, load_recipe
from gspo_cli.recipe.bounds import size_problems
from gspo_cli.train.engines.deepspeed_engine import deepspeed_config
from gspo_cli.train.engines.distributed import check_expert_count, check_world_size
from gspo_cli.train.engines.settings import engine_settings

BASE = {
    "model": {"path": "builtin:tiny-moe"},
    "rollout": {"num_prompts": 4, "group_size": 4},
    "algorithm": {"minibatches": 2},
}


def _recipe(ep: int, **sections: object) -> Recipe:
    return Recipe.model_validate(
        {
            "trainer": {"engine": "deepspeed"},
            "deepspeed": {"zero_stage": 2, "expert_parallel": ep},
            **BASE,
            **sections,
        }
    )


def test_default_is_no_expert_parallelism() -> None:
    recipe = Recipe.model_validate({"trainer": {"engine": "deepspeed"}})
    assert recipe.deepspeed.expert_parallel == 1
    assert "expert_parallel" not in deepspeed_config(engine_settings(recipe), world=2)


def test_config_enables_autoep_with_the_models_renormalisation() -> None:
    class Config:
        norm_topk_prob = False

    cfg = deepspeed_config(engine_settings(_recipe(2)), world=2, model_config=Config())  # type: ignore[arg-type]
    assert cfg["expert_parallel"] == {"enabled": True, "autoep_size": 2, "route_norm": False}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("deepspeed: {expert_parallel: 0}\n", "greater than or equal to 1"),
        ("deepspeed: {zero_stage: 0, expert_parallel: 2}\n", "expert_parallel needs zero_stage"),
    ],
)
def test_recipe_refuses(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=message):
        load_recipe(path)


def test_world_size_lora_and_engine_refusals() -> None:
    check_world_size(_recipe(2), 2)
    check_world_size(_recipe(2), 4)
    with pytest.raises(GspoError, match=r"expert_parallel \(2\) must divide the number of "):
        check_world_size(_recipe(2), 1)
    with pytest.raises(GspoError, match=r"expert_parallel \(4\) must divide the number of "):
        check_world_size(_recipe(4, rollout={"num_prompts": 6, "group_size": 4}), 6)
    with pytest.raises(GspoError, match="does not run with LoRA"):
        check_world_size(_recipe(2, model={"lora": {"r": 4}}), 2)
    with pytest.raises(GspoError, match=r"needs trainer\.engine deepspeed"):
        check_world_size(_recipe(2, trainer={"engine": "torch"}), 1)


def test_user_json_may_not_set_expert_parallel(tmp_path: Path) -> None:
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"expert_parallel": {"enabled": True, "autoep_size": 2}}))
    recipe = Recipe.model_validate(
        {"trainer": {"engine": "deepspeed"}, "deepspeed": {"config_file": str(user)}}
    )
    with pytest.raises(GspoError, match=r"set by the recipe's deepspeed\.expert_parallel"):
        deepspeed_config(engine_settings(recipe), world=2)


def test_expert_count_refusals() -> None:
    check_expert_count(8, 2)
    check_expert_count(0, 1)  # a dense model without expert parallelism
    with pytest.raises(GspoError, match=r"must divide the model's expert count \(8\)"):
        check_expert_count(8, 3)
    with pytest.raises(GspoError, match="needs a Mixture-of-Experts model"):
        check_expert_count(0, 2)


def test_engine_refuses_a_checkpoint_of_another_ep(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gspo_cli.train.engines.deepspeed_engine import EP_FILE, DeepSpeedEngine

    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / EP_FILE).write_text(json.dumps({"expert_parallel": 2}))
    engine = SimpleNamespace(expert_parallel=1, adapters=None)
    with pytest.raises(GspoError, match=r"saved at deepspeed\.expert_parallel 2, resumed at 1"):
        DeepSpeedEngine.load_state(engine, tmp_path)  # type: ignore[arg-type]
    (tmp_path / "deepspeed" / EP_FILE).unlink()  # written before expert parallelism: EP 1
    with pytest.raises(GspoError, match=r"saved at deepspeed\.expert_parallel 1, resumed at 4"):
        DeepSpeedEngine.load_state(SimpleNamespace(expert_parallel=4, adapters=None), tmp_path)  # type: ignore[arg-type]


def test_expert_count_is_refused_at_validate_time_when_the_config_is_on_disk(
    tmp_path: Path,
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8}))
    recipe = _recipe(3, model={"path": str(tmp_path)}, rollout={"num_prompts": 6, "group_size": 4})
    (problem,) = size_problems(recipe)
    assert re.search(r"must divide the model's expert count \(8\)", problem)
    assert size_problems(_recipe(2, model={"path": str(tmp_path)})) == []


def test_a_builtin_models_expert_count_is_refused_at_validate_time() -> None:
    """Built-in shapes are known without building the model (recipe/bounds.py BUILTIN_SHAPES;
    tests/unit/recipe/test_recipe_bounds.py checks them against the built models)."""
    (problem,) = size_problems(_recipe(3, rollout={"num_prompts": 6, "group_size": 4}))
    assert "must divide the model's expert count (8): builtin:tiny-moe" in problem
    assert size_problems(_recipe(2, model={"path": "builtin:tiny-moe-deep"})) == []
    (dense,) = size_problems(_recipe(2, model={"path": "builtin:tiny-dense"}))
    assert "needs a Mixture-of-Experts model" in dense
