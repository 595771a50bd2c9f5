"""Response-token log-probs from the last hidden states, with the LM head's backward by hand.

Through autograd, `log_softmax(h W^T)[y]` costs four or five `[tokens, V]` tensors: the logits,
the logsumexp's temporary, the softmax and the scattered one-hot of the backward, and the copy
of a sliced view. At a 151,936-token vocabulary each is 0.6 GB per 1,024 tokens, and every one
is fresh memory that page-faults (0.2-0.35 s per GiB on the 2-core CPU machine). Here the
logits are the only such tensor: reductions run over row tiles that fit the allocator's reused
heap, and the backward turns the saved logits into their own gradient in place. Only real
response tokens go through the head, never padding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.shared_prompts import response_hidden

# Row tiles of at most this many float32 elements (16 MiB): under glibc's largest mmap
# threshold (32 MiB), so their temporaries come from the heap again and again.
TILE_ELEMENTS = 4 * 1024 * 1024


def at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 for the softmax; float32 and float64 as they are."""
    return logits.float() if logits.element_size() < 4 else logits


def _row_tiles(rows: int, vocab: int) -> list[slice]:
    step = max(1, TILE_ELEMENTS // max(vocab, 1))
    return [slice(start, start + step) for start in range(0, rows, step)]


class TokenLogprobs(torch.autograd.Function):
    """log softmax(scale * h W^T)[y] `[M]` for M tokens (`scale`: one number, or `[M]`, one per
    token), and their entropy `[M]` (empty when not asked; differentiable: an entropy bonus's
    gradient, d H / d z = -p (log p + H), costs the backward one more `[rows, V]` tile only when
    the entropy is used). Of the `[M, V]` size it saves the logits alone (with h, W, y, the
    logsumexp and the entropy); a second backward through it is refused by autograd (the logits
    are overwritten by their gradient). Under `no_grad` nothing is kept: no graph holds them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,  # [M, H]
        weight: torch.Tensor,  # [V, H]
        targets: torch.Tensor,  # [M]
        scale: float | torch.Tensor,  # or [M]: each token's 1 / temperature
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = at_least_float32(hidden @ weight.T)  # [M, V]
        if isinstance(scale, torch.Tensor):
            logits.mul_(scale.to(logits.dtype)[:, None])
        elif scale != 1.0:
            logits.mul_(scale)
        lse = logits.new_empty(logits.shape[0])  # [M]
        ent = logits.new_empty(logits.shape[0] if entropy else 0)  # [M] or [0]
        for rows in _row_tiles(*logits.shape):
            z = logits[rows]  # [r, V]
            lse[rows] = torch.logsumexp(z, dim=-1)
            if entropy:  # H = lse - sum_v p_v z_v
                p = (z - lse[rows, None]).exp_()  # [r, V]
                ent[rows] = lse[rows] - (p * z).sum(dim=-1)
        chosen = logits.gather(1, targets[:, None])[:, 0]  # [M]
        ctx.scale = scale
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        ctx.save_for_backward(hidden, weight, targets, logits, lse, ent)
        return chosen - lse, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, targets, logits, lse, ent = ctx.saved_tensors
        grad = logits  # [M, V], overwritten in place by d loss / d z
        if grad_logprobs is None:
            grad_logprobs = lse.new_zeros(lse.shape)
        g = grad_logprobs * ctx.scale  # [M]; d logprob / d z = onehot(y) - p
        g_ent = None if grad_entropy is None else grad_entropy * ctx.scale  # [M]
        for rows in _row_tiles(*grad.shape):
            log_p = grad[rows].sub_(lse[rows, None])  # [r, V], in place
            if g_ent is None:
                log_p.exp_().mul_(-g[rows, None])
                continue
            p = log_p.exp()  # [r, V]: -p (g + g_ent (log p + H))
            log_p.add_(ent[rows, None]).mul_(g_ent[rows, None]).add_(g[rows, None])
            log_p.mul_(p).neg_()
        grad[torch.arange(grad.shape[0], device=grad.device), targets] += g
        grad_in = grad.to(weight.dtype)  # [M, V]
        grad_hidden = grad_in @ weight if ctx.needs_input_grad[0] else None  # [M, H]
        grad_weight = grad_in.T @ hidden if ctx.needs_input_grad[1] else None  # [V, H]
        return grad_hidden, grad_weight, None, None, None


def head_logprobs(
    model: PreTrainedModel,
    head: nn.Linear,
    batch: TrainBatch,
    temperature: float,
    entropy: bool,
    share: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[n, T]` log-probs of the batch's response tokens, 0 where `response_mask` is 0, and
    their entropy when asked: the backbone's forward (each distinct prompt once when `share`:
    the capabilities allow it at this length, see shared_prompts.py), then the head on real
    response tokens."""
    real = batch.response_mask.bool()  # [n, T]
    h = response_hidden(model, batch, share)[real]  # [M, H]: position j predicts j + 1
    targets = batch.input_ids[:, -real.shape[1] :][real]  # [M]
    scale: float | torch.Tensor = 1.0 / temperature if temperature > 0 else 1.0
    if batch.temperature is not None:  # rows of their own temperature: each token its row's
        per_row = torch.where(batch.temperature > 0, 1.0 / batch.temperature, 1.0)  # [n]
        scale = per_row[:, None].expand(real.shape)[real]  # [M]
    token_lp, token_ent = TokenLogprobs.apply(h, head.weight, targets, scale, entropy)
    logprobs = token_lp.new_zeros(real.shape).index_put((real,), token_lp)  # [n, T]
    if not entropy:
        return logprobs, None
    return logprobs, token_ent.new_zeros(real.shape).index_put((real,), token_ent)
