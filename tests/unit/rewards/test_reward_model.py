"""The `reward_model` reward: a one-label sequence classifier built offline scores prompt +
completion deterministically, batched as unbatched; bad checkpoints are one line at validate."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification, Qwen3Config

from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.recipe.reward import RewardFunctionConfig
from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.reward_model import classifier_texts, reward_model_reward
from tests.support.helpers import invoke_cli, write_recipe

PROMPTS = ["What is 2+3?", [{"role": "user", "content": "Name a colour."}], "Say hi"]
COMPLETIONS = ["It is \\boxed{5}.", "Blue, mostly, or a long answer about red", "hi"]


def save_classifier(folder: Path, num_labels: int = 1, seed: int = 0) -> Path:
    import torch

    tokenizer = build_char_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_classifier(tmp_path_factory.mktemp("rm")))


def score(path: str, batch_size: int, completions: list[str] = COMPLETIONS) -> list[float]:
    return reward_model_reward(
        completions,
        PROMPTS,
        model=path,  # type: ignore[arg-type]
        batch_size=batch_size,  # type: ignore[arg-type]
        reward_context=RewardContext(device="cpu"),
    )


def test_scores_are_deterministic_and_batching_changes_nothing(classifier: str) -> None:
    one_by_one = score(classifier, 1)
    assert len(one_by_one) == 3 and all(isinstance(s, float) for s in one_by_one)
    assert score(classifier, 1) == one_by_one
    assert score(classifier, 3) == pytest.approx(one_by_one, abs=1e-5)
    assert score(classifier, 2) == pytest.approx(one_by_one, abs=1e-5)
    assert len(set(one_by_one)) == 3  # the text matters: three pairs, three scores


def test_the_completion_changes_the_score(classifier: str) -> None:
    other = score(classifier, 3, ["It is \\boxed{6}.", COMPLETIONS[1], "hello there"])
    base = score(classifier, 3)
    assert other[1] == pytest.approx(base[1], abs=1e-5)
    assert other[0] != pytest.approx(base[0], abs=1e-6)


def test_text_goes_through_the_classifiers_chat_template() -> None:
    tokenizer = build_char_tokenizer()
    text = classifier_texts(tokenizer, ["Q?"], ["A."])[0]
    assert text == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\nA.<|im_end|>\n"
    tokenizer.chat_template = None
    plain = classifier_texts(tokenizer, [[{"role": "user", "content": "Q?"}]], ["A."])
    assert plain == ["Q?\nA."]


def test_two_labels_and_missing_paths_are_refused_when_the_recipe_loads(tmp_path: Path) -> None:
    two = save_classifier(tmp_path / "two", num_labels=2)
    with pytest.raises(ValueError, match="num_labels 2; a reward model scores with one label"):
        RewardFunctionConfig(name="reward_model", options={"model": str(two)})
    with pytest.raises(ValueError, match="cannot load a classifier from"):
        RewardFunctionConfig(name="reward_model", options={"model": str(tmp_path / "nothing")})
    with pytest.raises(ValueError, match="batch_size"):
        RewardFunctionConfig(name="reward_model", options={"model": str(two), "batch_size": 0})


def test_gspo_validate_says_one_line_and_exits_2(tmp_path: Path) -> None:
    two = save_classifier(tmp_path / "two", num_labels=2)
    recipe = write_recipe(
        tmp_path,
        {"reward": {"functions": [{"name": "reward_model", "options": {"model": str(two)}}]}},
    )
    result = invoke_cli("validate", str(recipe))
    assert result.returncode == 2
    assert "num_labels 2" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
