"""Stop strings for the HF engine: a response may end right after the token that completes one
(`SamplingParams.stop`, used by tool calls). Last in the processor list, it makes end-of-turn the
only choice of such a row at the next step; the engine then drops that end-of-turn, which the
model did not sample, so the response ends at the stopping token, as vLLM's `stop` gives it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import LogitsProcessor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Tokens decoded per row and step: a stop string completed by the newest token lies inside them.
TAIL_TOKENS = 16


class StopStrings(LogitsProcessor):
    def __init__(
        self, stops: tuple[str, ...], tokenizer: PreTrainedTokenizerBase, prompt_width: int
    ) -> None:
        self.stops = stops
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width  # P: the response starts at this column
        self.eos_id = int(tokenizer.eos_token_id)
        self.rows: torch.Tensor | None = None  # [a] original index of each current row
        self.stopped: set[int] = set()  # original rows whose last end-of-turn was forced

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.rows is None:
            self.rows = torch.arange(scores.shape[0])
        new = input_ids[:, self.prompt_width :]  # [a, t]
        if new.shape[1] == 0:
            return scores
        tails = self.tokenizer.batch_decode(new[:, -TAIL_TOKENS:], skip_special_tokens=True)
        hits = [i for i, text in enumerate(tails) if any(s in text for s in self.stops)]
        for i in hits:
            row = int(self.rows[i])
            if row in self.stopped:  # `generate` keeps forwarding rows that have ended
                continue
            self.stopped.add(row)
            scores[i] = float("-inf")
            scores[i, self.eos_id] = 0.0
        return scores

    def step_done(self, chosen: torch.Tensor, going: torch.Tensor) -> None:
        """The decoding loop dropped the rows not in `going` (rollout/decode.py)."""
        assert self.rows is not None
        self.rows = self.rows[going.cpu()]
