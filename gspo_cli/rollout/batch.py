"""The responses a rollout engine returns: below both rollout/ (which makes them) and models/
(whose forward turns them into training tensors), so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ToolTrace:
    """What the tools did in one trajectory (rollout/tools/)."""

    calls: int = 0  # tool calls run, or answered with their error (a call that cannot be read)
    errors: int = 0  # calls that failed: an exception, a timeout, a call that could not be read
    refused: int = 0  # calls past max_calls: answered "not run", counted in neither above
    seconds: float = 0.0  # wall time of its calls
    cut_outputs: int = 0  # results cut to output_max_tokens
    session_restarts: int = 0  # calls that ended the interpreter's session (timeout, exit...)
    ended_by_budget: bool = False  # a result did not fit in max_new_tokens: the trajectory ended
    tool_tokens: int = 0  # environment tokens in the response
    environment_reward: float | None = None  # the environment's get_reward(), if it has one


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
    # Tool use (rollout/tools/): N lists [len_i], True on the tokens an environment wrote (tool
    # results: context, never targets); None: every token is the model's.
    from_tool: list[list[bool]] | None = None
    tool_traces: list[ToolTrace] | None = None  # N, with tool use
    # N temperatures each response was sampled at, where they differ within a batch (the
    # environments of a mixture); None: all at the step's temperature
    temperatures: list[float] | None = None

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)
