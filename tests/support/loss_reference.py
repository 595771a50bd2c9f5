"""Float64 loop references of every policy loss, written straight from each paper's equations,
one response and one token at a time. Shared by the loss tests (a helper, not a test module)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

import torch

Tensor = torch.Tensor
TAUS = (0.7, 1.6)  # SAPO temperatures for the tests (not the defaults)


def _clip_min(r: torch.Tensor, a: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return torch.minimum(r * a, torch.clamp(r, 1 - lo, 1 + hi) * a)


def _paper_loss(lp, old, adv, mask, algo, lo, hi, agg, w=None):  # type: ignore[no-untyped-def]
    """GSPO, GSPO-token, GRPO: -J, one response and one token at a time (Eq. 2, 5, 7, 13, 14);
    `w`: a weight on each token's term (a rollout correction), None: 1."""
    per_seq_terms = []  # list of (list of per-token objective terms)
    for i in range(lp.shape[0]):
        idx = [t for t in range(lp.shape[1]) if mask[i, t] > 0]
        if algo == "grpo":
            terms = [_clip_min(torch.exp(lp[i, t] - old[i, t]), adv[i, t], lo, hi) for t in idx]
        else:
            log_s = sum(lp[i, t] - old[i, t] for t in idx) / len(idx)
            s = torch.exp(log_s)
            if algo == "gspo":
                a_i = sum(adv[i, t] for t in idx) / len(idx)
                terms = [_clip_min(s, a_i, lo, hi)] * len(idx)  # one decision per response
            else:
                terms = [
                    _clip_min(
                        s.detach() * torch.exp(lp[i, t] - lp[i, t].detach()), adv[i, t], lo, hi
                    )
                    for t in idx
                ]
        if w is not None:
            terms = [w[i, t] * term for t, term in zip(idx, terms, strict=True)]
        per_seq_terms.append(terms)
    if agg == "seq_mean_token_mean":
        j = sum(sum(ts) / len(ts) for ts in per_seq_terms) / len(per_seq_terms)
    elif agg == "token_mean":
        j = sum(sum(ts) for ts in per_seq_terms) / sum(len(ts) for ts in per_seq_terms)
    else:
        j = sum(sum(ts) for ts in per_seq_terms) / len(per_seq_terms)
    return -j


def _sum(values: Iterable[Tensor]) -> Tensor:
    """A plain running sum (a float64 0-dim tensor, so that the types stay tensors)."""
    total = torch.zeros((), dtype=torch.float64)
    for value in values:
        total = total + value
    return total


def _clip(x: Tensor, low: float, high: float) -> Tensor:
    return torch.clamp(x, low, high)


def _sequence_terms(
    lp: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    algo: str,
    lo: float,
    hi: float,
    taus: tuple[float, float],
) -> list[list[Tensor]]:
    """Per response, the list of its per-token objective terms (a sequence-level term repeated
    on each token, as the aggregation then divides it out), from each paper's equation."""
    out: list[list[Tensor]] = []
    for i in range(lp.shape[0]):
        idx = [t for t in range(lp.shape[1]) if mask[i, t] > 0]
        n = len(idx)
        a_i = _sum(adv[i, t] for t in idx) / n
        if algo == "gmpo":  # arXiv 2507.20673 Eq. 3-4, per-token clip in log space first
            clipped = []
            for t in idx:
                log_r = lp[i, t] - old[i, t]
                if a_i > 0:
                    log_r = torch.clamp(log_r, max=hi)
                elif a_i < 0:
                    log_r = torch.clamp(log_r, min=-lo)
                clipped.append(log_r)
            term = a_i * torch.exp(_sum(clipped) / n)
            out.append([term] * n)
        elif algo == "sapo":  # arXiv 2511.20347: f_tau(r) A, tau by the advantage's sign
            terms = []
            for t in idx:
                r = torch.exp(lp[i, t] - old[i, t])
                tau = taus[0] if adv[i, t] > 0 else taus[1]
                terms.append(torch.sigmoid(tau * (r - 1)) * 4 / tau * adv[i, t])
            out.append(terms)
        elif algo in ("dppo_tv", "dppo_kl"):
            out.append([_dppo_term(lp[i, t], old[i, t], adv[i, t], algo, lo, hi) for t in idx])
        elif algo == "vespo":
            phi = _vespo_phi([float((lp[i, t] - old[i, t]).detach()) for t in idx], float(a_i))
            out.append([phi * adv[i, t] * lp[i, t] for t in idx])
        elif algo == "cispo":  # arXiv 2506.13585 Eq. 4: sg[clip(r)] A log pi
            terms = []
            for t in idx:
                r = torch.exp(lp[i, t] - old[i, t]).detach()
                terms.append(_clip(r, 1 - lo, 1 + hi) * adv[i, t] * lp[i, t])
            out.append(terms)
        else:
            raise ValueError(algo)
    return out


def _dppo_term(lp: Tensor, old: Tensor, a: Tensor, algo: str, lo: float, hi: float) -> Tensor:
    """DPPO (arXiv 2602.04879): r A, or 0 once the update left the trust region in the
    direction of A, by the sampled token's binary TV (p - q) or binary KL."""
    x, y = float(lp.detach()), float(old)
    p, q = math.exp(x), math.exp(y)
    if algo == "dppo_tv":
        up, down = p - q > hi, p - q < -lo
    else:  # log(1 - p) with p capped at 1 and 1 - p floored at the smallest float (as ours)
        log1m = lambda v: math.log(max(-math.expm1(min(v, 0.0)), sys.float_info.min))  # noqa: E731
        kl = q * (y - x) + (1 - q) * (log1m(y) - log1m(x))
        up, down = kl > hi and p > q, kl > lo and p < q
    out = (float(a) > 0 and up) or (float(a) <= 0 and down)
    return torch.zeros((), dtype=lp.dtype) if out else torch.exp(lp - old) * a


def _vespo_phi(log_ratios: list[float], a_i: float) -> float:
    """VESPO (arXiv 2602.10693; TRL's constants): phi(W) = W^k e^{lambda (1 - W)}, W the
    sequence's unnormalised ratio, (k, lambda) = (2, 3) for A >= 0, (3, 2) for A < 0."""
    log_w = sum(min(max(x, -20.0), 20.0) for x in log_ratios)
    log_w = min(max(log_w, math.log(1e-8)), 20.0)
    k, lam = (2.0, 3.0) if a_i >= 0 else (3.0, 2.0)
    w = math.exp(log_w)
    return w**k * math.exp(lam * (1 - w))


def _weighted(terms: list[list[Tensor]], mask: Tensor, w: Tensor | None) -> list[list[Tensor]]:
    """Each response's terms times its tokens' weights (in the order of its model tokens)."""
    if w is None:
        return terms
    out = []
    for i, ts in enumerate(terms):
        idx = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        out.append([w[i, t] * term for t, term in zip(idx, ts, strict=True)])
    return out


def reference_loss(
    lp: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    algo: str,
    lo: float,
    hi: float,
    agg: str,
    taus: tuple[float, float] = TAUS,
    w: Tensor | None = None,
) -> Tensor:
    """-J, the papers' objectives, one response and one token at a time (its model tokens:
    those where `mask` is 1, wherever they sit in the row); `w`: a weight on each token's
    term (a rollout correction), None: 1."""
    if algo in ("gspo", "gspo_token", "grpo"):
        return _paper_loss(lp, old, adv, mask, algo, lo, hi, agg, w)
    if algo == "luspo":  # arXiv 2602.05261 Eq. 7: (1/G) sum_i |y_i| min(s_i A_i, clip(s_i) A_i)
        assert agg == "seq_mean_token_mean"
        total = torch.zeros((), dtype=lp.dtype)
        for i in range(lp.shape[0]):
            idx = [t for t in range(lp.shape[1]) if mask[i, t] > 0]
            a_i = _sum(adv[i, t] for t in idx) / len(idx)
            s_i = torch.exp(_sum(lp[i, t] - old[i, t] for t in idx) / len(idx))
            term = torch.minimum(s_i * a_i, _clip(s_i, 1 - lo, 1 + hi) * a_i)
            weight = len(idx) if w is None else _sum(w[i, t] for t in idx)  # |y_i| x term
            total = total + weight * term
        return -total / lp.shape[0]
    terms = _weighted(_sequence_terms(lp, old, adv, mask, algo, lo, hi, taus), mask, w)
    if agg == "seq_mean_token_mean":
        j = _sum(_sum(ts) / len(ts) for ts in terms) / len(terms)
    elif agg == "token_mean":
        j = _sum(_sum(ts) for ts in terms) / sum(len(ts) for ts in terms)
    else:
        j = _sum(_sum(ts) for ts in terms) / len(terms)
    return -j
