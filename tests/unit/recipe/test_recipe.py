from __future__ import annotations

from pathlib import Path

import pytest

from gspo_cli.recipe import Recipe, RecipeError, load_recipe
from tests.support.helpers import REPO

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
        ("model:\n  path: ./no/such/model\n", "model.path: file not found: /"),
        ("data:\n  source: missing.jsonl\n", "data.source: file not found: /"),
        (
            "algorithm:\n  name: ppo\n",
            "algorithm.name: unknown algorithm 'ppo'; known: cispo, dppo_kl, dppo_tv, gmpo, grpo",
        ),
        (
            "algorithm:\n  loss_agg: mean\n",
            "algorithm.loss_agg: unknown loss aggregation 'mean'; known: seq_mean_token_mean",
        ),
        (
            "reward:\n  functions: [{name: code, options: {partial_credt: true}}]\n",
            "reward 'code' has no option 'partial_credt'; did you mean 'partial_credit'?",
        ),
        (
            "reward:\n  functions: [{name: code, options: {time_limit_s: soon}}]\n",
            "reward 'code' option 'time_limit_s': Input should be a valid number",
        ),
        (
            "reward:\n  functions: [{name: math, options: {math_pool: 1}}]\n",
            "reward 'math' has no option 'math_pool'",
        ),
        ("reward:\n  functions: [{name: verifier}]\n", "unknown reward 'verifier'; known: code"),
        ("reward:\n  functions: [{name: no_such_mod:f}]\n", "cannot import 'no_such_mod'"),
        (
            "algorithm: {routing_replay: old_policy}\nrollout: {use_engine_logprobs: true}\n",
            "routing_replay old_policy records experts in the trainer's pi_old forward",
        ),
        (
            "algorithm: {routing_replay: rollout}\nrollout: {engine: vllm}\n",
            "rollout.engine vllm does not return them here",
        ),
        ("trainer: {seed: yes}\n", "trainer.seed: Input should be a valid integer"),
        (
            "rollout: {dynamic_sampling_max_rounds: 0}\n",
            "rollout.dynamic_sampling_max_rounds: Input should be greater than or equal to 1",
        ),
        (
            "rollout: {dynamic_sampling: true, dynamic_sampling_max_rounds: 1001}\n",
            "rollout.dynamic_sampling_max_rounds: Input should be less than or equal to 1000",
        ),
        (
            "reward: {overlong_buffer: 64}\n",
            "reward.overlong_buffer (64) must be less than rollout.max_new_tokens (64)",
        ),
        (
            "reward: {overlong_penalty: -1}\n",
            "reward.overlong_penalty: Input should be greater than or equal to 0",
        ),
        (
            "reward: {overlong_penalty: 0.5}\n",
            "reward.overlong_penalty 0.5 has no effect with overlong_buffer 0",
        ),
        (
            "rollout: {dynamic_sampling_max_rounds: 3}\n",
            "rollout.dynamic_sampling_max_rounds 3 has no effect without dynamic_sampling",
        ),
        (
            "algorithm: {name: sapo, sapo_tau_pos: .inf}\n",
            "algorithm.sapo_tau_pos: Input should be a finite number",
        ),
        ("algorithm: {entropy_coef: .nan}\n", "algorithm.entropy_coef: Input should be a finite"),
        ("algorithm: {kl_coef: .inf}\n", "algorithm.kl_coef: Input should be a finite number"),
        ("", "the recipe file is empty"),
        ("a: [1\nb: 2\n", "line 2: invalid YAML"),
        ("- 1\n- 2\n", "a recipe must be a mapping"),
    ],
)
def test_problems_name_the_key_path(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "bad.yaml", text))
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_off_and_on_are_words_not_booleans(tmp_path: Path) -> None:
    """YAML 1.2 booleans: `off` is the option's name, as users write it (not PyYAML's False)."""
    text = "algorithm: {rollout_correction: off, routing_replay: off}\n"
    recipe = load_recipe(write(tmp_path, "r.yaml", text), ["trainer.on_collapse=stop"])
    assert (recipe.algorithm.rollout_correction, recipe.algorithm.routing_replay) == ("off", "off")
    flags = load_recipe(write(tmp_path, "f.yaml", "rollout: {use_engine_logprobs: True}\n"))
    assert flags.rollout.use_engine_logprobs is True


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = "algorithm: {clip_low: -1, bogus: 1}\nrollout: {group_size: 1}\n"
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "bad.yaml", text))
    assert len(info.value.problems) == 3


def test_malformed_set_override(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"expected KEY\.PATH=VALUE"):
        load_recipe(write(tmp_path, "a.yaml", "name: run\n"), ["algorithm.clip_high"])
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


def test_paths_in_a_recipe_are_relative_to_its_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "recipes" / "mine"
    folder.mkdir(parents=True)
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (tmp_path / "base.yaml").write_text("data:\n  eval_source: ./data.jsonl\n")
    recipe = write(
        folder,
        "r.yaml",
        "base: ../../base.yaml\n"
        "data:\n  source: ../../data.jsonl\n"
        "eval:\n  benchmark: gsm8k\n  data: ../../data.jsonl\n",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory does not matter
    loaded = load_recipe(recipe)
    data_file = str(tmp_path / "data.jsonl")
    assert loaded.data.source == data_file and loaded.eval.data == data_file
    assert loaded.data.eval_source == data_file  # the base's path, relative to the base
    # benchmark:NAME:PATH resolves its PATH part; hub ids and built-ins are left alone.
    text = "data:\n  source: benchmark:gsm8k:../../data.jsonl\n  eval_source: openai/gsm8k\n"
    loaded = load_recipe(write(folder, "b.yaml", text))
    assert loaded.data.source == f"benchmark:gsm8k:{data_file}"
    assert loaded.data.eval_source == "openai/gsm8k" and loaded.model.path == "builtin:tiny-dense"


def test_a_reward_can_be_the_users_own_function(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "my_rewards.py").write_text(
        "def shorter_is_better(completions, answer, *, scale: float = 1.0):\n"
        "    return [scale / (1 + len(c)) for c in completions]\n"
        "def sloppy(completions, **kwargs):\n"
        "    return [0.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = "reward:\n  functions: [{name: 'my_rewards:shorter_is_better', options: {scale: 2}}]\n"
    recipe = load_recipe(write(tmp_path, "r.yaml", text))
    assert recipe.reward.functions[0].options == {"scale": 2.0}
    # TRL style: **kwargs takes data columns, never an option a recipe sets
    load_recipe(write(tmp_path, "s.yaml", "reward:\n  functions: [{name: my_rewards.sloppy}]\n"))
    text = "reward:\n  functions: [{name: my_rewards.sloppy, options: {scale: 2}}]\n"
    with pytest.raises(RecipeError, match="has no option 'scale'; its options: none"):
        load_recipe(write(tmp_path, "t.yaml", text))
