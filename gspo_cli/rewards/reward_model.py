"""`reward_model`: a sequence classifier with one label scores each prompt + completion.

The classifier (`AutoModelForSequenceClassification`, `num_labels: 1`) is loaded once per
process and device, runs in the trainer's process on the trainer's device without gradients, in
batches of `batch_size`. The text it reads is the conversation [prompt turns..., assistant:
completion] through the classifier's own chat template when its tokenizer has one, else the
prompt's text and the completion joined by a newline. The score is the label's raw logit.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.registry import REWARDS
from gspo_cli.rewards.validated import AtLeastOne, checked_str_schema

BATCH_SIZE, MAX_LENGTH = AtLeastOne(8), AtLeastOne(2048)  # the options' defaults
_LOADED: dict[tuple[str, str], tuple[Any, Any]] = {}  # (path, device) -> (model, tokenizer)
_LOAD_LOCK = threading.Lock()


def check_classifier(path: str) -> str:
    """A classifier checkpoint with one label, by its config; ValueError (one line) otherwise."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"cannot load a classifier from {path!r}: {first}") from None
    if config.num_labels != 1:
        raise ValueError(
            f"{path!r} has num_labels {config.num_labels}; a reward model scores with one label"
        )
    return path


class ClassifierPath(str):
    """A checkpoint `check_classifier` accepts."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return checked_str_schema(check_classifier)


def prompt_text(prompt: Any) -> str:
    """A prompt as plain text: a string as it is, a conversation's turns' contents by lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(turn.get("content", "")) for turn in prompt or ())


def conversation(prompt: Any, completion: str) -> list[dict[str, str]]:
    """The prompt's turns (a string: one user turn) and the completion as the assistant's."""
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return [*turns, {"role": "assistant", "content": completion}]


def classifier_texts(tokenizer: Any, prompts: list[Any], completions: list[str]) -> list[str]:
    """What the classifier reads for each pair (see the module's docstring)."""
    if getattr(tokenizer, "chat_template", None):
        return [
            tokenizer.apply_chat_template(conversation(p, c), tokenize=False)
            for p, c in zip(prompts, completions, strict=True)
        ]
    return [f"{prompt_text(p)}\n{c}" for p, c in zip(prompts, completions, strict=True)]


def load_classifier(path: str, device: str) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process for each (path, device)."""
    with _LOAD_LOCK:
        if (path, device) not in _LOADED:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                model: Any = AutoModelForSequenceClassification.from_pretrained(path)
            except (OSError, ValueError) as exc:  # the contract turns it into one line
                raise ValueError(f"reward model {path!r} does not load: {exc}") from None
            if tokenizer.pad_token_id is None:  # batches need padding: the end token serves
                tokenizer.pad_token = tokenizer.eos_token
            # the classifier reads the last non-padding token: it must know which is padding
            model.config.pad_token_id = tokenizer.pad_token_id
            tokenizer.padding_side = "right"
            tokenizer.truncation_side = "left"  # too long: keep the completion's end
            _LOADED[(path, device)] = (model.to(device).eval(), tokenizer)
        return _LOADED[(path, device)]


@REWARDS.register("reward_model")
def reward_model_reward(
    completions: list[str],
    prompts: list[Any],
    *,
    model: ClassifierPath,
    batch_size: AtLeastOne = BATCH_SIZE,
    max_length: AtLeastOne = MAX_LENGTH,
    reward_context: RewardContext | None = None,
) -> list[float]:
    """The classifier's one logit for each prompt + completion."""
    import torch

    device = (reward_context or RewardContext()).torch_device()
    classifier, tokenizer = load_classifier(str(model), device)
    texts = classifier_texts(tokenizer, prompts, completions)
    templated = bool(getattr(tokenizer, "chat_template", None))
    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=not templated,  # a chat template places its own
        ).to(device)
        with torch.no_grad():
            logits = classifier(**batch).logits
        scores.extend(logits[:, 0].float().tolist())
    return scores
