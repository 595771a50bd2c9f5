"""The LM head with a hand-written backward (models/forward/lm_head.py) equals autograd on the
model's own logits: log-probs, entropy and every parameter's gradient."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
import transformers
from torch import nn
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from gspo_cli.models import create_builtin
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import (
    PLAIN_HEAD_MODEL_TYPES,
    capabilities_of,
    plain_linear_head,
)
from gspo_cli.models.forward.lm_head import TILE_ELEMENTS, TokenLogprobs
from gspo_cli.models.forward.logprobs import response_logprobs
from tests.support.small_models import small_causal_lm


def _batch(vocab: int) -> TrainBatch:
    """6 rows: a left-padded prompt, two responses cut short by right padding."""
    gen = torch.Generator().manual_seed(0)
    n, p, t = 6, 5, 9
    input_ids = torch.randint(10, vocab, (n, p + t), generator=gen)  # [n, P + T]
    response = torch.ones(n, t)  # [n, T]
    response[1, 4:] = 0
    response[2, 7:] = 0
    attention = torch.cat([torch.ones(n, p, dtype=torch.long), response.long()], dim=1)
    attention[0, :2] = 0
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    return TrainBatch(input_ids, attention, positions, response, p)


def _run(model: nn.Module, batch: TrainBatch, temperature: float, own_logits: bool):  # type: ignore[no-untyped-def]
    model.zero_grad()
    capabilities = capabilities_of(model)
    if own_logits:
        capabilities = dataclasses.replace(capabilities, plain_head=False)
    logprobs, entropy = response_logprobs(model, batch, temperature, True, capabilities)
    weights = torch.linspace(-1, 2, logprobs.numel()).view_as(logprobs)  # a non-uniform upstream
    (logprobs * weights * batch.response_mask).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    grads["the head"] = model.lm_head.weight.grad.clone()  # tied or not
    mask = batch.response_mask
    return logprobs.detach() * mask, entropy * mask, grads  # type: ignore[operator]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_the_head_equals_autograd_on_the_models_own_logits(name: str, temperature: float) -> None:
    model, _ = create_builtin(name, seed=0)
    assert plain_linear_head(model) is model.lm_head
    batch = _batch(model.config.vocab_size)
    ours = _run(model, batch, temperature, own_logits=False)
    theirs = _run(model, batch, temperature, own_logits=True)
    assert torch.allclose(ours[0], theirs[0], atol=1e-5)
    assert torch.allclose(ours[1], theirs[1], atol=1e-5)
    assert ours[2].keys() == theirs[2].keys()
    for key, grad in theirs[2].items():
        assert torch.allclose(ours[2][key], grad, atol=1e-5, rtol=1e-4), key
    assert float(ours[0].abs().sum()) > 0 and float(ours[1].min()) >= 0


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("model_type", sorted(PLAIN_HEAD_MODEL_TYPES))
def test_every_listed_family_equals_autograd(model_type: str, tied: bool) -> None:
    model = small_causal_lm(
        model_type,
        300,
        num_local_experts=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        tie_word_embeddings=tied,
    )
    assert plain_linear_head(model) is model.lm_head
    ours = _run(model, _batch(300), 0.7, own_logits=False)
    theirs = _run(model, _batch(300), 0.7, own_logits=True)
    assert torch.allclose(ours[0], theirs[0], atol=1e-5)
    assert torch.allclose(ours[1], theirs[1], atol=1e-5)
    for key, grad in theirs[2].items():
        assert torch.allclose(ours[2][key], grad, atol=1e-5, rtol=1e-4), key


def test_tiles_do_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    hidden = torch.randn(40, 16, requires_grad=True)  # [M, H]
    weight = torch.randn(300, 16, requires_grad=True)  # [V, H]
    targets = torch.randint(0, 300, (40,))

    def run() -> list[torch.Tensor]:
        hidden.grad = weight.grad = None
        logprobs, entropy = TokenLogprobs.apply(hidden, weight, targets, 1.25, True)
        (logprobs * torch.arange(40.0)).sum().backward()
        return [logprobs.detach(), entropy, hidden.grad, weight.grad]  # type: ignore[list-item]

    whole = run()
    monkeypatch.setattr(
        "gspo_cli.models.forward.lm_head.TILE_ELEMENTS", 7 * 300
    )  # 6 tiles of 7 rows
    assert TILE_ELEMENTS > 7 * 300
    tiled = run()
    for a, b in zip(whole, tiled, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    reference = torch.log_softmax(1.25 * hidden.detach() @ weight.detach().T, -1)
    assert torch.allclose(whole[0], reference.gather(1, targets[:, None])[:, 0], atol=1e-5)


def test_a_second_backward_is_refused() -> None:
    hidden = torch.randn(4, 8, requires_grad=True)
    logprobs, _ = TokenLogprobs.apply(hidden, torch.randn(20, 8), torch.zeros(4).long(), 1.0, False)
    logprobs.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logprobs.sum().backward()


@pytest.mark.parametrize("model_type", sorted(PLAIN_HEAD_MODEL_TYPES))
def test_every_listed_family_takes_its_logits_straight_from_the_head(model_type: str) -> None:
    source = inspect.getsource(
        getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]).forward
    )
    assert "logits = self.lm_head(hidden_states[:, slice_indices, :])" in source
    assert not any(word in source for word in ("softcap", "logit_scale", "logits_scaling"))


def test_other_heads_fall_back_to_the_models_own_logits() -> None:
    model, _ = create_builtin("tiny-dense", seed=0)
    assert plain_linear_head(nn.Sequential(model)) is None  # not a PreTrainedModel
    # a class of its own under a listed type (remote code) may scale its logits:
    renamed = type("RemoteCodeQwen3", (type(model),), {})
    model.__class__ = renamed
    assert plain_linear_head(model) is None
    model.__class__ = renamed.__mro__[1]
    model.config.model_type = "gemma2"  # soft-capped logits
    assert plain_linear_head(model) is None


def _scored(
    model: nn.Module, batch: TrainBatch, temperature: float, own_logits: bool, weights: torch.Tensor
):  # type: ignore[no-untyped-def]
    """Log-probs and entropy `[n, T]` (masked), and every parameter's gradient of
    sum(log-probs x `weights`)."""
    model.zero_grad()
    capabilities = capabilities_of(model)
    if own_logits:
        capabilities = dataclasses.replace(capabilities, plain_head=False)
    logprobs, entropy = response_logprobs(model, batch, temperature, True, capabilities)
    (logprobs * weights * batch.response_mask).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    mask = batch.response_mask
    return logprobs.detach() * mask, entropy.detach() * mask, grads  # type: ignore[union-attr]


@pytest.mark.parametrize("own_logits", [False, True], ids=["our head", "own logits"])
def test_rows_of_their_own_temperature_score_as_they_would_alone(own_logits: bool) -> None:
    """A mixture's rows sampled at several temperatures (TrainBatch.temperature): each row's
    log-probs and entropy equal those of its rows forwarded alone at their own temperature, and
    the gradient is the sum of theirs (float64)."""
    model, _ = create_builtin("tiny-dense", seed=0)
    model = model.double()
    batch = _batch(model.config.vocab_size)
    weights = torch.linspace(-1, 2, batch.response_mask.numel(), dtype=torch.float64)
    weights = weights.view_as(batch.response_mask)  # [n, T] a non-uniform upstream
    temperatures = torch.tensor([1.0, 0.7, 1.3, 0.7, 1.0, 1.3], dtype=torch.float64)
    mixed = _scored(model, batch._replace(temperature=temperatures), 1.0, own_logits, weights)
    summed = {key: torch.zeros_like(g) for key, g in mixed[2].items()}
    for value in (0.7, 1.0, 1.3):
        rows = (temperatures == value).nonzero().flatten()
        alone = _scored(model, batch.select(rows), value, own_logits, weights[rows])
        torch.testing.assert_close(mixed[0][rows], alone[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(mixed[1][rows], alone[1], rtol=1e-10, atol=1e-12)
        for key, grad in alone[2].items():
            summed[key] += grad
    for key, grad in mixed[2].items():
        torch.testing.assert_close(grad, summed[key], rtol=1e-9, atol=1e-12)
    one = _scored(model, batch, 1.0, own_logits, weights)[0]
    assert not torch.allclose(mixed[0], one)  # the temperatures mattered
