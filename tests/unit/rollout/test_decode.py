"""The decoding loop that drops finished rows (rollout/decode.py) gives `generate`'s tokens and
log-probs, computing fewer rows."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from gspo_cli.models import create_builtin
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.hf import HFGenerateEngine
from tests.support.rl_helpers import PROMPTS
from tests.support.small_models import small_causal_lm


class EndAfterSmallTokens(LogitsProcessor):
    """Forces end-of-turn after any sampled token id under 20, so rows end unevenly (per row
    it looks only at the row itself: right whichever rows the batch still holds)."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.prompt_width = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.prompt_width = self.prompt_width or input_ids.shape[1]
        ends = (input_ids[:, -1] < 20) & (input_ids.shape[1] > self.prompt_width)  # [a]
        out = scores.clone()
        out[ends] = float("-inf")
        out[ends, self.eos] = 0.0
        return out  # type: ignore[return-value]


class Uneven(HFGenerateEngine):
    def __init__(self, *args: Any, drop_finished: bool) -> None:
        super().__init__(*args)
        self.drop_finished = drop_finished
        self.rows_forwarded = 0
        self.model.base_model.register_forward_hook(self._count)

    def _count(self, module: Any, args: Any, output: Any) -> None:
        self.rows_forwarded += output.last_hidden_state.shape[0]

    def _processors(self, *args: Any) -> Any:
        processors = super()._processors(*args)
        processors.insert(1, EndAfterSmallTokens(int(self.tokenizer.eos_token_id)))
        return processors

    def _sample(self, *args: Any) -> torch.Tensor:
        return super()._sample(*args[:5], self.drop_finished)


def _both_ways(
    model: Any, tokenizer: Any, params: SamplingParams, seeds: list[int] | None
) -> tuple[tuple[RolloutBatch, int], tuple[RolloutBatch, int]]:
    """(rollout, rows forwarded) with finished rows dropped, then with `generate`."""
    out = []
    for drop in (True, False):
        engine = Uneven(model, tokenizer, drop_finished=drop)
        out.append((engine.generate(PROMPTS, params, seeds), engine.rows_forwarded))
    return out[0], out[1]


def test_dropping_finished_rows_gives_generates_tokens_and_logprobs() -> None:
    """Seeded: each row's noise is its own, so the two loops must pick the same tokens."""
    model, tokenizer = create_builtin("tiny-dense", seed=3)
    params = SamplingParams(
        temperature=0.8, top_k=50, max_new_tokens=24, num_samples=4, logprobs=True
    )
    (lean, lean_rows), (full, full_rows) = _both_ways(model, tokenizer, params, [5, 6, 7, 8])
    lengths = sorted(len(c) for c in full.completion_ids)
    assert lengths[0] < lengths[-1]  # uneven: some rows end early
    assert lean.completion_ids == full.completion_ids
    assert lean.truncated == full.truncated
    assert lean.completion_logprobs is not None and full.completion_logprobs is not None
    for a, b in zip(lean.completion_logprobs, full.completion_logprobs, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert lean_rows < full_rows  # finished rows were not computed


def test_a_hybrid_conv_attention_model_drops_rows_from_every_cache_layer() -> None:
    """LFM2 caches conv states besides keys and values: they must leave with their rows."""
    _, tokenizer = create_builtin("tiny-dense", seed=3)
    model = small_causal_lm(
        "lfm2",
        len(tokenizer),
        block_dim=64,
        block_ff_dim=128,
        layer_types=["conv", "full_attention"],
        pad_token_id=int(tokenizer.pad_token_id),
        eos_token_id=int(tokenizer.eos_token_id),
    )
    params = SamplingParams(temperature=0.8, max_new_tokens=12, num_samples=2, logprobs=True)
    (lean, lean_rows), (full, full_rows) = _both_ways(model, tokenizer, params, [1, 2, 3, 4])
    assert lean.completion_ids == full.completion_ids
    assert lean_rows < full_rows


def test_greedy_decoding_equals_generate() -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=3)
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    (lean, _), (full, _) = _both_ways(model, tokenizer, params, None)
    assert lean.completion_ids == full.completion_ids
