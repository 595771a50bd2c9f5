"""A scripted rollout engine: known programs in place of a model that cannot write code yet.

The built-in tiny model never writes a program, so an eval run on it judges every sample
`no_code`. `FixedRolloutEngine` answers each problem's prompt with fixed completions instead,
so the sandbox verdicts, pass@k and the Elo estimates are computed from real judging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.data import render_prompt
from gspo_cli.data.benchmarks import build_prompt
from gspo_cli.data.problems import Problem
from gspo_cli.eval.runner import EngineFactory
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch

PromptKey = tuple[int, ...]


class FixedRolloutEngine:
    """Implements `RolloutEngine`: sample j of a prompt is `answers[prompt][j % len(answers)]`."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, answers: Mapping[PromptKey, Sequence[str]]
    ) -> None:
        self.tokenizer = tokenizer
        self.answers = answers

    def close(self) -> None:
        """Nothing to free."""

    def sync_weights(self) -> None:
        """Nothing to sync: the answers never change."""

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        **_: object,
    ) -> RolloutBatch:
        batch = RolloutBatch([], [], [], [], [])
        for prompt in prompts:
            texts = self._answers_for(prompt)
            for j in range(params.num_samples):
                self._add(batch, prompt, texts[j % len(texts)])
        return batch

    def _answers_for(self, prompt: list[int]) -> Sequence[str]:
        try:
            return self.answers[tuple(prompt)]
        except KeyError:  # the runner renders prompts differently from `prompt_key`
            text = self.tokenizer.decode(prompt)[:200]
            raise KeyError(f"no fixed answers for the prompt {text!r}") from None

    def _add(self, batch: RolloutBatch, prompt: list[int], text: str) -> None:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        batch.prompt_ids.append(list(prompt))
        batch.completion_ids.append(ids)
        batch.completion_logprobs.append(torch.zeros(len(ids)))
        batch.texts.append(text)
        batch.truncated.append(False)


def prompt_key(tokenizer: PreTrainedTokenizerBase, problem: Problem) -> PromptKey:
    """The token ids `gspo eval` sends to the engine for this problem."""
    return tuple(render_prompt(tokenizer, build_prompt(problem)))


def fixed_engine(
    problems: Sequence[Problem], completions: Mapping[str, Sequence[str]]
) -> EngineFactory:
    """An engine factory for `run_eval` answering problem p with `completions[p.id]` in turn."""

    def build(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> FixedRolloutEngine:
        answers = {prompt_key(tokenizer, p): completions[p.id] for p in problems}
        return FixedRolloutEngine(tokenizer, answers)

    return build
