from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe import Recipe, RecipeError, load_recipe
from gspo_cli.train.engines.deepspeed_engine import deepspeed_config
from gspo_cli.train.engines.settings import engine_settings


def _recipe(**sections: object) -> Recipe:
    return Recipe.model_validate({"trainer": {"engine": "deepspeed"}, **sections})


def test_config_is_derived_from_the_recipe() -> None:
    recipe = _recipe(
        rollout={"num_prompts": 8, "group_size": 8},
        algorithm={"minibatches": 4},
        trainer={"engine": "deepspeed", "micro_batch_size": 4},
        optimizer={"max_grad_norm": 0.5},
        model={"dtype": "bfloat16"},
        deepspeed={"zero_stage": 3, "offload_optimizer": True, "offload_params": True},
    )
    cfg = deepspeed_config(engine_settings(recipe), world=2)
    assert cfg["train_micro_batch_size_per_gpu"] == 4
    assert cfg["gradient_accumulation_steps"] == 2  # 64 / 4 minibatches / 2 ranks / 4 per micro
    assert cfg["gradient_clipping"] == 0.5 and cfg["bf16"] == {"enabled": True}
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert cfg["zero_optimization"]["offload_param"] == {"device": "cpu"}


def test_user_json_is_merged_and_contradictions_rejected(tmp_path: Path) -> None:
    user = tmp_path / "ds.json"
    user.write_text(
        json.dumps(
            {"zero_optimization": {"reduce_bucket_size": 1000}, "comms_logger": {"enabled": False}}
        )
    )
    cfg = deepspeed_config(engine_settings(_recipe(deepspeed={"config_file": str(user)})), world=1)
    assert (
        cfg["zero_optimization"]["reduce_bucket_size"] == 1000
        and cfg["zero_optimization"]["stage"] == 2
    )
    assert cfg["comms_logger"] == {"enabled": False}
    user.write_text(json.dumps({"gradient_clipping": 5.0}))
    with pytest.raises(GspoError, match=r"gradient_clipping=5\.0 contradicts the recipe"):
        deepspeed_config(engine_settings(_recipe(deepspeed={"config_file": str(user)})), world=1)
    user.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    with pytest.raises(GspoError, match="'optimizer' is set by the recipe"):
        deepspeed_config(engine_settings(_recipe(deepspeed={"config_file": str(user)})), world=1)


def test_offload_params_needs_zero3(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("deepspeed: {zero_stage: 2, offload_params: true}\n")
    with pytest.raises(RecipeError, match="offload_params needs zero_stage 3"):
        load_recipe(path)


def test_world_size_checks_name_the_fix() -> None:
    from gspo_cli.train.engines.distributed import check_world_size

    base = {"rollout": {"num_prompts": 2, "group_size": 12}, "algorithm": {"minibatches": 2}}
    check_world_size(_recipe(**base), 2)
    with pytest.raises(
        GspoError, match="micro_batch_size \\(4\\) must divide each rank's minibatch"
    ):
        check_world_size(_recipe(**base, trainer={"engine": "deepspeed", "micro_batch_size": 4}), 2)
    with pytest.raises(GspoError, match="multiple of the number of processes"):
        check_world_size(_recipe(**base), 4)
    with pytest.raises(GspoError, match="minibatches must divide"):
        check_world_size(
            _recipe(rollout={"num_prompts": 2, "group_size": 6}, algorithm={"minibatches": 4}), 2
        )
