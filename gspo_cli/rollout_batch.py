"""The responses a rollout engine returns: below both rollout/ (which makes them) and models/
(whose forward turns them into training tensors), so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RolloutBatch:
    """N = len(prompts) * num_samples responses, ordered prompt by prompt (group by group)."""

    prompt_ids: list[list[int]]  # N prompts' token ids (each repeated num_samples times)
    completion_ids: list[list[int]]  # N responses' token ids, EOS included when generated
    # N tensors [len_i]: log pi(y_t) from the raw logits at the sampling temperature (what the
    # trainer computes; no top-k/top-p renormalisation); None unless `SamplingParams.logprobs`.
    completion_logprobs: list[torch.Tensor] | None
    texts: list[str]  # N decoded responses, special tokens removed
    truncated: list[bool]  # N: True when max_new_tokens was hit before EOS
    # N tensors [L, len_i, k] int16 (`SamplingParams.routed_experts`): the top-k experts of each
    # MoE layer for every token forwarded while generating (the prompt and all but the last
    # response token, in order); None otherwise.
    routed_experts: list[torch.Tensor] | None = None

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)
