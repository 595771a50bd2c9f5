"""Prompt rendering: a question through the recipe's template and the tokenizer's chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str, template: str) -> list[int]:
    """Token ids of one question formatted by `template` and the tokenizer's chat template."""
    content = template.format(prompt=question)
    messages = [{"role": "user", "content": content}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(content)["input_ids"])
