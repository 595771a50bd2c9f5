"""The entropy that `response_logprobs` returns for the entropy bonus carries the right gradient
on every forward path: the hand-written LM head (with and without shared prompts) and the
model's own logits (the DeepSpeed engine's path)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gspo_cli.models import create_builtin
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import capabilities_of
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.step.train_batch import build_train_batch

TEMPERATURE = 0.7


def _batch() -> TrainBatch:
    prompts = [[2, 10, 11, 12, 3, 6, 2]] * 2 + [[2, 40, 3, 6, 2]] * 2  # two groups of two
    completions = [[20, 21, 22, 3], [23, 24], [30, 31, 32, 33, 34, 3], [35]]
    rollout = RolloutBatch(prompts, completions, None, ["a", "b", "c", "d"], [False] * 4)
    return build_train_batch(rollout, pad_id=0)


def _reference(model: torch.nn.Module, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """log-probs and entropy `[n, T]` from the model's full logits through autograd."""
    t = batch.response_mask.shape[1]
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits[:, -t - 1 : -1]  # [n, T, V]
    log_p = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    chosen = log_p.gather(-1, batch.input_ids[:, -t:, None])[..., 0]
    return chosen, -(log_p.exp() * log_p).sum(dim=-1)


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [dict(model.named_parameters())[n] for n in names])
    return dict(zip(names, grads, strict=True))


@pytest.mark.parametrize("path", ["head", "head_shared_prompts", "model_logits"])
def test_entropy_gradient_matches_autograd_through_the_full_logits(path: str) -> None:
    model, _ = create_builtin("tiny-dense", seed=0)
    model = model.double()
    batch = _batch()
    mask = batch.response_mask.double()
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(mask.shape, generator=gen, dtype=torch.float64)  # weights on log-probs
    w = torch.randn(mask.shape, generator=gen, dtype=torch.float64)  # and on entropies
    capabilities = capabilities_of(model, share_prompts=path == "head_shared_prompts")
    if path == "model_logits":  # as for a DeepSpeed engine, which declares no plain head
        capabilities = dataclasses.replace(capabilities, plain_head=False)
    lp, ent = response_logprobs(model, batch, TEMPERATURE, "grad", capabilities)
    assert ent is not None and ent.requires_grad
    got = _grads(model, ((a * lp + w * ent) * mask).sum())
    ref_lp, ref_ent = _reference(model, batch)
    torch.testing.assert_close((ent * mask).detach(), (ref_ent * mask).detach())
    want = _grads(model, ((a * ref_lp + w * ref_ent) * mask).sum())
    # shared prompts: RMSNorm rounds to float32 even in a float64 model, and the gradients a
    # prompt collects from its rows are summed in another order (see test_shared_prompts.py)
    rel = 1e-5 if path == "head_shared_prompts" else 1e-10
    for name, grad in want.items():
        gap = float((got[name] - grad).abs().max())
        assert gap <= rel * float(grad.abs().max()), (name, gap)
    # the entropy term alone moves the weights (the check above is not the log-probs' alone)
    entropy_only = _grads(model, (w * _reference(model, batch)[1] * mask).sum())
    assert max(float(g.abs().max()) for g in entropy_only.values()) > 1e-6


def test_the_metric_entropy_of_the_model_logits_path_has_no_graph() -> None:
    model, _ = create_builtin("tiny-dense", seed=0)
    own_logits = dataclasses.replace(capabilities_of(model), plain_head=False)
    _, ent = response_logprobs(model, _batch(), TEMPERATURE, True, own_logits)
    assert ent is not None and not ent.requires_grad
