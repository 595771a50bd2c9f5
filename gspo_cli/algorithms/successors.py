"""GSPO's successors: LUSPO, SAPO, GMPO and CISPO, registered next to GSPO in `POLICY_LOSSES`.

Each maps `[B, T]` log-probs to a per-token loss `[B, T]` to minimise; `compute_policy_loss`
aggregates it with `algorithm.loss_agg`. A sequence-level term is put on every token of its
response, as GSPO does, so seq_mean_token_mean returns the mean over sequences of that term.
Clip ranges and paper aggregations per algorithm are in `losses.PAPER_CLIP`,
`losses.PAPER_LOSS_AGG` and `losses.ONLY_LOSS_AGG`; docs/options/successor-losses.md compares
them with TRL and verl.
"""

from __future__ import annotations

import torch

from gspo_cli.algorithms.losses import (
    DEFAULT_LOSS_OPTIONS,
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    LossOptions,
    TokenLoss,
    gspo_loss,
    sequence_advantage,
    token_ratio,
)


@POLICY_LOSSES.register("luspo")
def luspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own (passed on to GSPO)
) -> TokenLoss:
    """LUSPO (arXiv 2602.05261, Eq. 7): GSPO's sequence term times the response length,

        J = (1/G) sum_i |y_i| * min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i),

    so each token of y_i gets the gradient s_i A_i grad log pi (Eq. 8) with no 1/|y_i|.
    Every token carries |y_i| x GSPO's sequence loss: seq_mean_token_mean (the only aggregation
    allowed, `losses.ONLY_LOSS_AGG`) then gives Eq. 7. Ratio, clip and clip decisions are
    GSPO's, one per sequence.
    """
    gspo = gspo_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, options=options)
    lengths = mask.sum(dim=1, keepdim=True)  # [B, 1] |y_i|
    return TokenLoss(gspo.loss * lengths, gspo.ratio)  # [B, T], [B, T]


@POLICY_LOSSES.register("sapo")
def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,
) -> TokenLoss:
    """SAPO (arXiv 2511.20347): a soft, temperature-controlled gate replaces the hard clip,

        f_tau(r) = sigmoid(tau (r - 1)) * 4 / tau,  tau = tau_pos if A_i > 0 else tau_neg,
        J = (1/G) sum_i (1/|y_i|) sum_t f_tau(r_it) A_it.

    Token gradient w_it r_it A_it grad log pi with w = 4 p (1 - p), p = sigmoid(tau (r - 1)):
    1 at r = 1, decaying smoothly away from it. `clip_low` / `clip_high` are unused (there is
    no hard clip) and the clip fractions read 0. The log-ratio is clamped to +-20 as in verl.
    """
    r = token_ratio(logprobs, old_logprobs)  # [B, T]
    # full_like: python-scalar where() would round the temperatures to float32
    tau_pos = torch.full_like(advantages, options.sapo_tau_pos)  # [B, T]
    tau = torch.where(advantages > 0, tau_pos, options.sapo_tau_neg)  # [B, T]
    gate = torch.sigmoid(tau * (r - 1.0)) * 4.0 / tau  # [B, T] f_tau(r)
    token_loss = -gate * advantages  # [B, T]
    return TokenLoss(token_loss, r.detach(), torch.zeros_like(token_loss, dtype=torch.int8))


@POLICY_LOSSES.register("gmpo")
def gmpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """GMPO (arXiv 2507.20673, Eq. 3-4 and Alg. 1): the geometric mean of token ratios, each
    clipped in LOG space before the mean, on the side its advantage's sign selects:

        lc_it = min(l_it, eps_high) if A_i > 0,  max(l_it, -eps_low) if A_i < 0,
        J = (1/G) sum_i A_i * exp((1/|y_i|) sum_t lc_it),   l_it = log pi - log pi_old.

    `clip_low` / `clip_high` are these log-space bounds (as verl's geo_mean), not ratio offsets:
    the paper's range (e^-0.4, e^0.4) is clip_low = clip_high = 0.4 (Table 5). A_i is the mean
    of `advantages` over the response; A_i = 0 contributes nothing. The mean log-ratio is
    clamped to +-20 like GSPO's.
    """
    seq_adv = sequence_advantage(advantages, mask)  # [B]
    log_r = logprobs - old_logprobs  # [B, T]
    pos = (seq_adv > 0).unsqueeze(1)  # [B, 1]
    neg = (seq_adv < 0).unsqueeze(1)  # [B, 1]
    clipped_lr = torch.where(pos, log_r.clamp(max=clip_high), log_r)  # [B, T]
    clipped_lr = torch.where(neg, clipped_lr.clamp(min=-clip_low), clipped_lr)  # [B, T]
    mean_lr = (clipped_lr * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
    term = seq_adv * mean_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]
    token_loss = (-term).unsqueeze(1).expand_as(logprobs)  # [B, T]
    log_r = log_r.detach()
    high = pos & (log_r > clip_high)  # [B, T] the clip zeroed these tokens' gradient
    low = neg & (log_r < -clip_low)  # [B, T]
    clipped = high.to(torch.int8) - low.to(torch.int8)  # [B, T]
    ratio = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B, T] r_it
    return TokenLoss(token_loss, ratio, clipped)


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    options: LossOptions = DEFAULT_LOSS_OPTIONS,  # no knobs of its own
) -> TokenLoss:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4-5): REINFORCE with a clipped, detached IS
    weight, so every token keeps a gradient:

        J = (1/sum_i |y_i|) sum_i sum_t sg[clip(r_it, 1-eps_low, 1+eps_high)] A_it log pi(y_it).

    The paper sets eps_low "large" (no lower bound) and reports no eps_high; the default
    (1.0, 0.2) puts the lower bound at 0, which a ratio never crosses (verl's example uses 10,
    the same thing), and takes verl's example eps_high 0.2. Its paper aggregation is
    token_mean (`losses.PAPER_LOSS_AGG`). The loss value (-w A log pi) is a surrogate: only its
    gradient means something.
    """
    r = token_ratio(logprobs, old_logprobs).detach()  # [B, T]
    weight = r.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T] sg[clip(r)]
    token_loss = -weight * advantages * logprobs  # [B, T]
    moved = advantages != 0  # [B, T] where clipping the weight changes the gradient
    high = moved & (r > 1.0 + clip_high)
    low = moved & (r < 1.0 - clip_low)
    return TokenLoss(token_loss, r, high.to(torch.int8) - low.to(torch.int8))
