"""VESPO (arXiv 2602.10693): a variational kernel reshapes each sequence's importance weight,
with no length normalisation, on a REINFORCE gradient.

    W_i = pi(y_i) / pi_old(y_i) = exp(sum_t log r_it)      (a sum: no 1/|y_i|)
    phi(W) = W^k exp(lambda (1 - W))                          (phi(1) = 1; 0 as W -> 0 or inf)
    J = sum_i sum_t sg[phi(W_i)] A_it log pi(y_it) / (number of tokens)

k and lambda are the paper's c1 and c2, picked by the sign of the sequence's advantage: A >= 0
takes (vespo_k_pos 2, vespo_lambda_pos 3), A < 0 (vespo_k_neg 3, vespo_lambda_neg 2) (TRL's
defaults, as the authors' code). As TRL computes it: each token's log-ratio is clamped to
[-20, 20] before the sum, log W to [log 1e-8, 20], lambda to at least 1e-4, and a phi that is
not finite counts 0. The paper's W is against the sampling policy (pi_old = the engine's
log-probs: `rollout.use_engine_logprobs`); with a recomputed pi_old and a rollout correction,
the correction stays a factor of its own on each token (docs/options/off-policy.md) rather
than entering W as TRL folds it in.
"""

from __future__ import annotations

import math

import torch

from gspo_cli.algorithms.losses.ratios import LOG_RATIO_CLAMP, sequence_advantage
from gspo_cli.algorithms.losses.spec import (
    DEFAULT_LOSS_OPTIONS,
    LOSS_SPECS,
    LossOptions,
    LossSpec,
    TokenLoss,
)

LOG_W_MIN = math.log(1e-8)  # TRL's floor on log W
LAMBDA_MIN = 1e-4  # TRL's floor on lambda


def vespo_weights(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, options: LossOptions,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`[B]` phi(W_i) (no grad) and `[B]` W_i."""
    log_r = (logprobs - old_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_w = (log_r * mask).sum(dim=1).clamp(LOG_W_MIN, LOG_RATIO_CLAMP)  # [B]
    positive = sequence_advantage(advantages.detach(), mask) >= 0  # [B]
    k = torch.where(positive, options.vespo_k_pos, options.vespo_k_neg).to(log_w.dtype)
    lam = torch.where(positive, options.vespo_lambda_pos, options.vespo_lambda_neg)
    lam = lam.to(log_w.dtype).clamp(min=LAMBDA_MIN)
    w = log_w.exp()  # [B]
    phi = torch.exp(lam + k * log_w - lam * w)  # [B] W^k e^{lambda (1 - W)}
    return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0), w


def vespo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,
) -> TokenLoss:
    """VESPO (module docstring); clip_low / clip_high are unused (a kernel, not a clip). The
    loss value (-phi A log pi) is a surrogate: only its gradient means something."""
    phi, w = vespo_weights(logprobs, old_logprobs, advantages, mask, options)
    token_loss = -phi.unsqueeze(1) * advantages * logprobs  # [B, T]
    no_clip = torch.zeros_like(logprobs, dtype=torch.int8)
    return TokenLoss(token_loss, w.unsqueeze(1).expand_as(logprobs), no_clip)


# No clip; the gradient is normalised by the batch's tokens, as TRL and the authors' code do
# (a per-sequence mean would bring back the length normalisation VESPO leaves out).
LOSS_SPECS.add(
    "vespo",
    LossSpec(
        vespo_loss,
        (0.2, 0.2),
        hard_clip=False,
        paper_loss_agg="token_mean",
        loss_aggs=frozenset({"token_mean"}),
    ),
)
