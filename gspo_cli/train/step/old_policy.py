"""Where an RL step's pi_old comes from: the trainer's recompute, or the rollout engine's log-probs.

GSPO's ratio is a sequence-level, length-normalised one (Eq. 7), so the paper (section 5.4) can
take pi_old straight from the inference engine's likelihoods and skip the trainer's no-grad
forward over every trained response. That is only sound while the engine and the trainer agree
far more closely than the clip window is wide: GSPO clips log s_i at log(1 + eps_high), about
4e-4, and the engine-vs-trainer gap must not move a sequence a visible part of the way there.

`rollout.use_engine_logprobs`:
- `true`: always the engine's log-probs.
- `false`: always recompute (and, when the engine returns log-probs, measure the gap).
- `auto` (the default): for sequence-ratio algorithms with exact engine log-probs (top-p 1,
  top-k 0, no rollout correction, no old-policy routing replay) every step measures the largest
  |sequence log-ratio| between engine and trainer on the rows of its first training forward,
  which runs before any update and so is the trainer's pi_old for them: the check costs no
  forward. Within `GAP_SHARE_OF_CLIP` x log(1 + eps_high) the step keeps the engine's
  log-probs; beyond it the step recomputes pi_old for every trained row before any loss is
  taken. The check keeps no state, so resume and rollback stay exact. Everything else under
  `auto` recomputes, as `false`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from gspo_cli.algorithms import LOSS_SPECS, mismatch_metrics, rollout_correction
from gspo_cli.models.forward.batch import TrainBatch, pad_logprobs
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.torch_engine import LogprobModel
from gspo_cli.train.step.micro import MicroBatch
from gspo_cli.train.step.replay import StepRouting
from gspo_cli.train.step.settings import AlgorithmSettings, EngineLogprobs

# The engine's log-probs stand in for pi_old while no checked response's sequence log-ratio
# (engine vs trainer) exceeds this share of the clip window's upper edge log(1 + eps_high).
GAP_SHARE_OF_CLIP = 0.1


@dataclass(frozen=True)
class PiOldTiming:
    """When a step's batch was sampled and when it reads pi_old: both can rule `auto` out."""

    # a KL in the reward or distillation reads pi_old of every row before the advantages,
    # earlier than `auto`'s check can run
    before_advantages: bool = False
    # rollout.max_staleness > 0: the batch comes from an older policy
    asynchronous: bool = False


def resolve_engine_logprobs(
    setting: EngineLogprobs,
    *,
    algorithm: str,
    rollout_correction: str,
    top_p: float,
    top_k: int,
    routing_replay: str,
    timing: PiOldTiming = PiOldTiming(),
) -> EngineLogprobs:
    """`rollout.use_engine_logprobs` as a step runs it: True, False, or "auto" (the gated
    mode) where `auto` can apply; `auto` elsewhere recomputes (False), as it does where pi_old
    of every row is read before the advantages (`timing.before_advantages`).

    `timing.asynchronous`: the batch comes from an older policy, so the gate would always
    fail; `auto` takes the behaviour policy's log-probs as pi_old, unless a rollout correction
    recomputes pi_old and corrects towards them (the recipe refuses a recompute with
    neither)."""
    if setting != "auto":
        return setting
    if timing.asynchronous:
        return rollout_correction == "off"
    if timing.before_advantages:
        return False
    exact = top_p == 1 and top_k == 0  # top-p/top-k log-probs are renormalised: not pi_old's
    applies = (
        LOSS_SPECS.get(algorithm).sequence_ratio
        and exact
        and rollout_correction == "off"  # the correction needs the recompute by definition
        and routing_replay != "old_policy"  # it records experts in the recompute forward
    )
    return "auto" if applies else False


def gap_limit(clip_high: float) -> float:
    """The largest engine-vs-trainer |sequence log-ratio| under which `auto` trusts the engine."""
    return GAP_SHARE_OF_CLIP * math.log1p(clip_high)


@dataclass
class OldPolicy:
    logprobs: torch.Tensor  # [N, T] pi_old per response token
    weights: torch.Tensor | None  # [N, T] rollout-correction weights, or None
    loss_mask: torch.Tensor  # [N, T]
    from_engine: bool  # pi_old is the engine's log-probs (the first ratio then shows the gap)
    unchecked: bool = False  # `auto` before `check_first_forward`
    metrics: dict[str, float] = field(default_factory=dict)


def forward_no_grad(
    engine: LogprobModel,
    batch: TrainBatch,
    plan: list[MicroBatch],
    temperature: float,
    routing: StepRouting | None = None,
) -> torch.Tensor:
    """`[N, T]` log-probs of the current weights, without grad, for the rows of `plan` (0 for
    the others); the pi_old forward when `routing` is given: it records or replays experts."""
    out: torch.Tensor | None = None  # [N, T] float32, or float64 for a float64 model
    with torch.no_grad():
        for index, filler in plan:
            sub = batch.select(index).trimmed()
            with (
                contextlib.nullcontext()
                if routing is None or filler
                else routing.old_policy_forward(sub, index)
            ):
                lp, _ = engine.logprobs(sub, temperature)
            if out is None:
                dtype = torch.promote_types(lp.dtype, torch.float32)
                out = torch.zeros(batch.response_mask.shape, dtype=dtype)
            if not filler:
                out[index, : lp.shape[1]] = lp.to(out.dtype).cpu()
    return torch.zeros(batch.response_mask.shape) if out is None else out


@dataclass(frozen=True)
class PiOldInputs:
    """What every pi_old source reads, gathered once per step."""

    engine: LogprobModel
    batch: TrainBatch
    plan: list[MicroBatch]  # the no-grad forward's micro-batches (trained rows, or all)
    temperature: float
    routing: StepRouting
    ctx: DistContext
    engine_logprobs: torch.Tensor | None  # [N, T] the rollout engine's, when it returned them


def engine_logprobs_of(rollout: RolloutBatch, batch: TrainBatch) -> torch.Tensor | None:
    """`[N, T]` the rollout engine's log-probs laid out as `batch`'s responses, if any."""
    if rollout.completion_logprobs is None:
        return None
    return pad_logprobs(rollout.completion_logprobs, batch.response_mask.shape[1])


def pi_old(
    inputs: PiOldInputs, algo: AlgorithmSettings, use_engine_logprobs: EngineLogprobs
) -> OldPolicy:
    """pi_old of a step from the source `use_engine_logprobs` (already resolved) names; under
    `auto` the engine's, still to be checked by `check_first_forward`. When both the engine's
    and the trainer's exist, the mismatch is measured and the rollout correction (if any)
    applied."""
    mask, engine_lp = inputs.batch.response_mask, inputs.engine_logprobs
    if use_engine_logprobs is not False:
        if engine_lp is None:
            raise ValueError("use_engine_logprobs needs the rollout engine's log-probs")
        return OldPolicy(engine_lp, None, mask, True, unchecked=use_engine_logprobs == "auto")
    return _recomputed(inputs, algo)


def _recomputed(inputs: PiOldInputs, algo: AlgorithmSettings) -> OldPolicy:
    mask, engine_lp = inputs.batch.response_mask, inputs.engine_logprobs
    old_lp = forward_no_grad(
        inputs.engine, inputs.batch, inputs.plan, inputs.temperature, inputs.routing
    )  # [N, T]
    if engine_lp is None:
        return OldPolicy(old_lp, None, mask, from_engine=False)
    metrics = _mismatch(old_lp, engine_lp, mask, algo)
    correction = algo.correction
    if correction.name == "off":
        return OldPolicy(old_lp, None, mask, from_engine=False, metrics=metrics)
    weights, keep = rollout_correction(correction.name, old_lp, engine_lp, mask, correction.limits)
    kept = keep.sum().clamp(min=1)
    # out of the gradient: dropped from the loss (keep 0) or weighed 0 (icepop's band)
    trained = (keep * (weights != 0)).sum()
    metrics["correction_masked_token_frac"] = float(1 - trained / mask.sum().clamp(min=1))
    metrics["correction_weight_mean"] = float((weights * keep).sum() / kept)
    return OldPolicy(old_lp, weights, keep, from_engine=False, metrics=metrics)


def check_first_forward(
    old: OldPolicy,
    inputs: PiOldInputs,
    algo: AlgorithmSettings,
    logprobs: torch.Tensor,
    rows: torch.Tensor | None,
) -> OldPolicy:
    """`auto`'s check, free: the step's first training forward (`logprobs` `[m, W]` of `rows`,
    None for a filler) runs before any update, so it IS the trainer's pi_old for its rows.
    Its largest |sequence log-ratio| against the engine's (over ranks) decides: within
    `gap_limit`, the engine's log-probs stay pi_old; beyond it, pi_old is recomputed for every
    trained row before any loss is taken."""
    gap = 0.0
    if rows is not None:
        width = logprobs.shape[1]
        mask = inputs.batch.response_mask[rows, :width]  # [m, W]
        engine = old.logprobs[rows, :width].to(logprobs.device)  # [m, W]
        gap = _mismatch(logprobs.detach(), engine, mask.to(logprobs.device), algo)[
            "mismatch_seq_log_ratio_abs_max"
        ]
    gate = {
        "engine_gap_seq_max": inputs.ctx.all_reduce_max(gap),  # every rank decides alike
        "engine_gap_limit": gap_limit(algo.loss.clip_high),
    }
    if gate["engine_gap_seq_max"] <= gate["engine_gap_limit"]:
        return OldPolicy(old.logprobs, None, old.loss_mask, True, metrics=gate)
    recomputed = _recomputed(inputs, algo)
    recomputed.metrics.update(gate)
    return recomputed


def _mismatch(
    old_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, algo: AlgorithmSettings
) -> dict[str, float]:
    loss = algo.loss
    return mismatch_metrics(old_lp, engine_lp, mask, loss.clip_low, loss.clip_high)
