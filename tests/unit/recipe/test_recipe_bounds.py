"""Size bounds checked at validate time: the rollout batch cap, prompt + response lengths
against the model's positions, max_staleness against the run's steps, LoRA ranks against the
adapted layers and the memory, and the memory warning given before anything is loaded."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest

from gspo_cli.recipe import Recipe, RecipeError, bounds, load_recipe
from gspo_cli.recipe.bounds import (
    ACTIVATION_VALUES,
    BUILTIN_SHAPES,
    HF_GENERATE_ROWS,
    MAX_ROLLOUT_BATCH,
    ModelShape,
    estimate_memory,
    memory_warning,
    shape_from_config,
)
from tests.support.helpers import invoke_cli

# A model folder needs only config.json to validate; these sizes are Qwen2.5-7B's.
BIG_CONFIG = {
    "model_type": "qwen2",
    "max_position_embeddings": 32768,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_size": 3584,
    "vocab_size": 152064,
}


def problems(tmp_path: Path, text: str, overrides: list[str] | None = None) -> list[str]:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, overrides)
    return info.value.problems


def model_folder(tmp_path: Path, **config: object) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**BIG_CONFIG, **config}))
    return folder


def test_the_rollout_batch_is_capped_with_the_reason(tmp_path: Path) -> None:
    found = problems(tmp_path, "rollout: {num_prompts: 16, group_size: 1000000000}\n")
    assert len(found) == 1
    assert found[0].startswith("rollout.group_size: rollout.num_prompts x rollout.group_size")
    assert "16000000000 responses per step" in found[0] and "MAX_ROLLOUT_BATCH" in found[0]
    text = "rollout: {num_prompts: 70000, group_size: 2}\nalgorithm: {minibatches: 1}\n"
    found = problems(tmp_path, text)
    assert found[0].startswith("rollout.num_prompts:")
    at_cap = f"rollout: {{num_prompts: {MAX_ROLLOUT_BATCH // 2}, group_size: 2}}\n"
    (tmp_path / "ok.yaml").write_text(at_cap)
    assert load_recipe(tmp_path / "ok.yaml").rollout.group_size == 2


def test_lengths_past_a_builtin_models_positions(tmp_path: Path) -> None:
    found = problems(tmp_path, "rollout: {max_new_tokens: 10000000}\n")
    assert found == [
        "rollout.max_new_tokens: data.max_prompt_tokens + rollout.max_new_tokens = 256 + 10000000 "
        "= 10000256 is past the 8192 positions of builtin:tiny-dense (its max_position_embeddings)"
        ": lower one of them"
    ]
    text = "data: {max_prompt_tokens: 4096}\nrollout: {max_new_tokens: 4096}\n"
    (tmp_path / "ok.yaml").write_text(text)  # exactly 8192: fits
    assert load_recipe(tmp_path / "ok.yaml").rollout.max_new_tokens == 4096


def test_lengths_past_a_local_folders_config(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, max_position_embeddings=512)
    text = f"model: {{path: {folder}}}\nrollout: {{max_new_tokens: 200}}\n"
    found = problems(tmp_path, text, ["eval.max_new_tokens=300", "data.max_prompt_tokens=400"])
    assert [p.split(":")[0] for p in found] == ["rollout.max_new_tokens", "eval.max_new_tokens"]
    assert "400 + 300 = 700 is past the 512 positions" in found[1]
    (tmp_path / "ok.yaml").write_text(text)
    assert load_recipe(tmp_path / "ok.yaml").rollout.max_new_tokens == 200  # 256 + 200 fits


def test_an_unreadable_config_json_is_one_line(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    (folder / "config.json").write_text("{not json")
    found = problems(tmp_path, f"model: {{path: {folder}}}\n")
    assert len(found) == 1 and found[0].startswith(f"model.path: cannot read {folder}")


def test_memory_hungry_settings_warn_before_loading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = model_folder(tmp_path)
    recipe = tmp_path / "r.yaml"
    # A 7B model's micro-batch of 8,192 rows x 8,448 tokens: hundreds of TiB of activations.
    recipe.write_text(
        f"model: {{path: {folder}, dtype: bfloat16}}\ntrainer: {{device: cpu}}\n"
        "data: {max_prompt_tokens: 256}\n"
        "rollout: {num_prompts: 512, group_size: 64, max_new_tokens: 8192}\n"
    )
    with caplog.at_level(logging.WARNING, logger="gspo_cli.recipe.bounds"):
        load_recipe(recipe)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"warning: {folder}: about ")
    assert "for one training micro-batch of 8192 rows (69206016 tokens: " in lines[0]
    assert "GiB of RAM available: lower trainer.micro_batch_size" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gspo_cli.recipe.bounds"):
        small = ["rollout={num_prompts: 2, group_size: 2, max_new_tokens: 8}"]
        load_recipe(recipe, [*small, "data.max_prompt_tokens=8", "algorithm.minibatches=1"])
    assert caplog.records == []  # 4 rows of 16 tokens: about 0.3 GiB


def test_the_memory_estimate_counts_kv_cache_activations_and_logits() -> None:
    recipe = Recipe.model_validate(
        {"rollout": {"num_prompts": 4, "group_size": 2, "max_new_tokens": 64},
         "data": {"max_prompt_tokens": 64}, "algorithm": {"minibatches": 2}}
    )  # fmt: skip
    shape = ModelShape(positions=1024, layers=2, hidden=16, kv_heads=1, head_dim=8, vocab=100)
    kv_cache = 8 * 128 * (2 * 2 * 1 * 8 * 4)  # 8 rows x 128 tokens x K and V of 2 layers
    activations = 4 * 128 * (2 * ACTIVATION_VALUES) * 16 * 4  # a micro-batch: 8 rows / 2
    logits = 4 * 64 * 100 * 4  # its response tokens x vocabulary, float32
    estimate = estimate_memory(recipe, shape)
    assert estimate is not None and estimate[:3] == (kv_cache, activations, logits)
    assert memory_warning(recipe, shape, available=estimate.total) is None
    line = memory_warning(recipe, shape, available=estimate.total - 1)
    assert line is not None and "micro-batch of 4 rows (512 tokens: " in line
    assert memory_warning(recipe, shape._replace(vocab=None), available=0) is None  # unknown
    recipe.model.gradient_checkpointing = True  # keeps each layer's input, one layer's all
    smaller = estimate_memory(recipe, shape)
    assert (
        smaller is not None
        and smaller.activation_bytes == 4 * 128 * (2 + ACTIVATION_VALUES) * 16 * 4
    )


def test_the_hf_engines_rows_at_once_match_the_estimate() -> None:
    import inspect

    from gspo_cli.rollout.hf import HFGenerateEngine

    default = inspect.signature(HFGenerateEngine).parameters["max_batch"].default
    assert default == HF_GENERATE_ROWS


def test_config_names_of_other_families() -> None:
    gpt2 = {"n_positions": 1024, "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257}
    assert shape_from_config(gpt2) == ModelShape(1024, 12, 768, 12, 64, 50257)
    multimodal = {"model_type": "llava", "text_config": {**BIG_CONFIG, "head_dim": 96}}
    assert shape_from_config(multimodal) == ModelShape(32768, 28, 3584, 4, 96, 152064)


@pytest.mark.parametrize("name", sorted(BUILTIN_SHAPES))
def test_builtin_shapes_match_the_models_the_registry_builds(name: str) -> None:
    from gspo_cli.models.builtin import BUILTIN_MODELS, create_builtin
    from gspo_cli.models.gguf import PRETRAINED_BUILTINS
    from gspo_cli.models.loading import hf_path

    assert sorted(BUILTIN_SHAPES) == sorted([*BUILTIN_MODELS.names(), *PRETRAINED_BUILTINS])
    if name in PRETRAINED_BUILTINS:  # its converted folder's config (converted once, cached)
        config = json.loads((Path(hf_path(f"builtin:{name}")) / "config.json").read_text())
    else:
        config = create_builtin(name, seed=0)[0].config.to_dict()
    assert shape_from_config(config) == BUILTIN_SHAPES[name]


def test_lengths_are_checked_again_once_the_model_is_loaded(tmp_path: Path) -> None:
    # A hub model's config is unknown at validate time; after loading, its positions are.
    from gspo_cli.core.errors import GspoError
    from gspo_cli.models import create_builtin
    from gspo_cli.train.run.cold_start import load_recipe_model

    model, tokenizer = create_builtin("tiny-dense", seed=0)
    model.config.max_position_embeddings = 128
    model.save_pretrained(tmp_path / "small")
    tokenizer.save_pretrained(tmp_path / "small")
    recipe = Recipe.model_validate(
        {"model": {"path": str(tmp_path / "small")}, "rollout": {"max_new_tokens": 64}}
    )  # schema only: the loader's bounds never ran
    with pytest.raises(GspoError, match="256 \\+ 64 = 320 is past the 128 positions"):
        load_recipe_model(recipe)


def test_a_max_staleness_the_run_never_reaches_is_refused(tmp_path: Path) -> None:
    text = "rollout: {max_staleness: 4}\ntrainer: {steps: 4}\n"
    found = problems(tmp_path, text)
    assert len(found) == 1 and found[0].startswith("rollout.max_staleness: 4 is not below")
    assert "every step would train on batches sampled by the initial policy" in found[0]
    assert problems(tmp_path, text, ["trainer.steps=2"])[0].startswith("rollout.max_staleness")
    (tmp_path / "ok.yaml").write_text("rollout: {max_staleness: 3}\ntrainer: {steps: 4}\n")
    assert load_recipe(tmp_path / "ok.yaml").rollout.max_staleness == 3


def test_the_memory_estimate_counts_lora_adapters_gradients_and_adamw_states() -> None:
    recipe = Recipe.model_validate({"model": {"lora": {"r": 8}}})
    shape = BUILTIN_SHAPES["tiny-dense"]
    without = estimate_memory(recipe, shape)
    with_adapters = estimate_memory(recipe, shape, adapter_params=1000)
    assert without is not None and with_adapters is not None
    assert with_adapters.adapter_bytes == 1000 * (4 + 4 + 8)  # fp32 weights, grads, 2 states
    assert with_adapters.total == without.total + 16_000
    line = memory_warning(recipe, shape, available=without.total, adapter_params=1000)
    assert line is not None and "LoRA adapters with gradients and AdamW states" in line


def _validate(tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {path: builtin:tiny-dense}\ntrainer: {device: cpu}\n")
    return invoke_cli("validate", str(recipe), *[a for s in settings for a in ("--set", s)])


def test_a_lora_rank_above_every_adapted_layers_dimensions_is_refused(tmp_path: Path) -> None:
    # tiny-dense: hidden 128, k/v 64, MLP 384; no layer's update has rank above 128
    result = _validate(tmp_path, "model.lora.r=100000")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "model.lora.r: 100000 is more than any adapted layer can use" in result.stderr
    assert "(972,800,000 instead of 1,245,184); use r 128 or less" in result.stderr
    only_k = _validate(tmp_path, "model.lora.r=65", "model.lora.target_modules=[k_proj]")
    assert only_k.returncode == 2 and "use r 64 or less" in only_k.stderr
    assert _validate(tmp_path, "model.lora.r=128").returncode == 0


def test_a_lora_rank_whose_adapters_exceed_the_memory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = Recipe.model_validate({"model": {"lora": {"r": 128}}, "trainer": {"device": "cpu"}})
    without = estimate_memory(recipe, BUILTIN_SHAPES["tiny-dense"])
    assert without is not None
    # room for the run and 4 MiB: r 8's adapters (1.2 MB with their states), not r 128's (20 MB)
    monkeypatch.setattr(bounds, "available_memory_bytes", lambda: without.total + 4 * 1024**2)
    result = _validate(tmp_path, "model.lora.r=128")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "model.lora.r: 128 gives 1,245,184 adapter parameters, 19.0 MiB" in result.stderr
    assert "lower model.lora.r or target fewer modules" in result.stderr
    assert _validate(tmp_path, "model.lora.r=8").returncode == 0


def test_the_expert_count_is_read_under_the_names_the_router_code_reads() -> None:
    from gspo_cli.models import routing
    from gspo_cli.recipe import bounds

    assert bounds.EXPERT_COUNT_KEYS == routing.EXPERT_COUNT_KEYS
    for key in bounds.EXPERT_COUNT_KEYS:
        assert shape_from_config({key: 6}).experts == 6
    assert shape_from_config({"num_experts": 1}).experts == 0  # one expert is a dense block


def test_keep_best_by_heldout_needs_checkpoints_at_heldout_steps() -> None:
    from gspo_cli.recipe import Recipe

    trainer = {"keep_best": 2, "checkpoint_every": 30}
    with pytest.raises(ValueError, match=r"make trainer.checkpoint_every \(30\) a multiple"):
        Recipe.model_validate({"trainer": trainer, "eval": {"every": 25}})
    Recipe.model_validate({"trainer": {**trainer, "best_metric": "reward_mean"}})  # any step
    Recipe.model_validate({"trainer": {**trainer, "checkpoint_every": 50}})
