"""Each distinct prompt run once (models/forward/shared_prompts.py) gives the padded batch's
log-probs, entropy and gradients, for every listed dense family; everything else keeps the
padded path."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from gspo_cli.models import create_builtin
from gspo_cli.models.forward import shared_prompts
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import (
    SHARED_PROMPT_MODEL_TYPES,
    can_share_prompts,
    capabilities_of,
)
from gspo_cli.models.forward.distinct import distinct_rows
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.models.forward.shared_prompts import distinct_prompts
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.train.step.train_batch import build_train_batch
from tests.support.small_models import small_causal_lm

VOCAB = 300


def _batch(seed: int = 0) -> TrainBatch:
    """8 rows of 3 prompts (7, 11 and 4 tokens: left padding), interleaved, not grouped, with
    responses of 1 to 8 tokens (right padding)."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(10, VOCAB, (n,), generator=gen).tolist()

    prompts = [tokens(7), tokens(11), tokens(4)]
    which = [0, 1, 0, 2, 1, 0, 2, 2]
    responses = [tokens(int(torch.randint(1, 9, (1,), generator=gen))) for _ in which]
    rollout = RolloutBatch(
        [prompts[i] for i in which], responses, None, [""] * len(which), [False] * len(which)
    )
    return build_train_batch(rollout, pad_id=0)


def _family(model_type: str) -> PreTrainedModel:
    return small_causal_lm(model_type, VOCAB).double()


def _run(model: PreTrainedModel, batch: TrainBatch, share: bool):  # type: ignore[no-untyped-def]
    model.zero_grad()
    capabilities = capabilities_of(model, share_prompts=share)
    logprobs, entropy = response_logprobs(model, batch, 0.7, True, capabilities)
    weights = torch.linspace(-1, 2, logprobs.numel()).view_as(logprobs)  # a non-uniform upstream
    (logprobs * weights.double() * batch.response_mask).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy, grads


def test_rows_find_their_prompt() -> None:
    batch = _batch()
    first, inverse = distinct_prompts(batch)
    assert inverse.tolist() == [inverse[0], inverse[1], inverse[0], inverse[6], inverse[1],
                                inverse[0], inverse[6], inverse[6]]  # fmt: skip
    assert len(first) == 3 and sorted(first.tolist()) == [0, 1, 3]
    assert torch.equal(inverse[first], torch.arange(3))  # a representative row of its own prompt


@pytest.mark.parametrize("model_type", sorted(SHARED_PROMPT_MODEL_TYPES))
def test_every_listed_family_gives_the_padded_result(
    model_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _family(model_type)
    batch = _batch()
    calls: list[int] = []
    shared = shared_prompts._on_shared_prompts
    monkeypatch.setattr(
        shared_prompts,
        "_on_shared_prompts",
        lambda *args: calls.append(1) or shared(*args),  # type: ignore[func-returns-value]
    )
    padded = _run(model, batch, share=False)
    assert not calls
    ours = _run(model, batch, share=True)
    assert calls == [1]  # the shared path ran
    assert torch.allclose(ours[0], padded[0], atol=1e-10)
    assert torch.allclose(ours[1], padded[1], atol=1e-10)  # type: ignore[arg-type]
    assert padded[2].keys() == ours[2].keys()
    for key, grad in padded[2].items():
        # RMSNorm computes in float32 even in a float64 model: the gradients a prompt collects
        # from its rows are rounded to float32 there, in another order than row by row
        gap = float((ours[2][key] - grad).abs().max())
        assert gap <= 1e-5 * float(grad.abs().max()), key
    assert max(float(g.abs().max()) for g in padded[2].values()) > 1e-3  # a real gradient


def test_the_builtin_model_shares_and_the_moe_does_not() -> None:
    dense, _ = create_builtin("tiny-dense", seed=0)
    moe, _ = create_builtin("tiny-moe", seed=0)
    assert can_share_prompts(dense, 100)
    assert not can_share_prompts(moe, 100)  # its router would see each prompt token once
    dense.gradient_checkpointing_enable()
    assert not can_share_prompts(dense, 100)  # checkpointing turns the cache off


def test_an_attention_window_shorter_than_a_row_keeps_the_padded_path() -> None:
    model = _family("mistral")
    model.config.sliding_window = 16
    assert can_share_prompts(model, 16) and not can_share_prompts(model, 17)


def test_rotary_frequencies_that_follow_the_length_keep_the_padded_path() -> None:
    """ "dynamic" rescales RoPE from the longest position a call sees: the prompt pass alone
    would rotate its keys otherwise than the whole row does."""
    model = _family("llama")
    assert can_share_prompts(model, 100)
    for rope_type in ("dynamic", "longrope"):
        model.config.rope_parameters = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 1e4}
        assert not can_share_prompts(model, 100), rope_type
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    assert can_share_prompts(model, 100)


def test_dropout_while_training_keeps_the_padded_path() -> None:
    model = _family("qwen3")
    model.config.attention_dropout = 0.1
    assert not can_share_prompts(model.train(), 100)  # one mask would serve a whole group
    assert can_share_prompts(model.eval(), 100)


def test_no_rows_have_no_distinct_rows() -> None:
    first, inverse = distinct_rows(torch.zeros((0, 4), dtype=torch.long))
    assert first.numel() == 0 and inverse.numel() == 0
