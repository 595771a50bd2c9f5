"""One RL step: collect Q x G scored responses (collect.py), then take `minibatches` optimiser
steps on them (`train_groups`)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from gspo_cli.algorithms import (
    LossOptions,
    compute_policy_loss,
    group_advantages,
    loss_normalizer,
    resolve_loss_agg,
)
from gspo_cli.algorithms.kl import kl_reward_advantages
from gspo_cli.models.forward.batch import TrainBatch, turn_ids
from gspo_cli.rollout.base import RolloutEngine
from gspo_cli.train.engines.distributed import LOCAL, DistContext
from gspo_cli.train.engines.torch_engine import LogprobModel, TrainEngine
from gspo_cli.train.step.collect import collect_groups
from gspo_cli.train.step.distill import Teacher, sequence_view, teacher_advantages, token_signal
from gspo_cli.train.step.metrics import add_mismatch, count_skipped_rows, shaping_metrics, summarise
from gspo_cli.train.step.micro import StepPlan, plan_step, rows_with_signal
from gspo_cli.train.step.old_policy import (
    OldPolicy,
    PiOldInputs,
    check_first_forward,
    engine_logprobs_of,
    forward_no_grad,
    pi_old,
)
from gspo_cli.train.step.replay import StepRouting
from gspo_cli.train.step.rewards import RewardModel
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.settings import StepOutput, StepSettings
from gspo_cli.train.step.train_batch import build_train_batch, check_sampled_ids
from gspo_cli.train.step.utilisation import flop_metrics


def _micro_batch_loss(
    parts: dict[str, list[float]],
    settings: StepSettings,
    first_update: bool,
    old_from_engine: bool,
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    index: torch.Tensor,
    width: int,
    old_lp: torch.Tensor,
    ref_lp: torch.Tensor | None,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    weights: torch.Tensor | None,
    norm: float,
    turns: torch.Tensor | None,
) -> torch.Tensor:
    """The policy loss of rows `index` (`logprobs` `[m, width]`), normalised by the whole
    minibatch's `norm`; its metrics go to `parts`."""
    algo = settings.algorithm
    device = logprobs.device
    mask = loss_mask[index, :width].to(device)  # [m, width]
    old = old_lp[index, :width].to(device)  # [m, width]
    tokens = mask.sum().clamp(min=1)
    if first_update:  # nothing updated yet: pi must equal pi_old
        if entropy is not None:
            parts["entropy_before"].append(float((entropy.detach() * mask).sum() / tokens))
        parts["first_ratio_gap_max"].append(float(((logprobs.detach() - old) * mask).abs().max()))
        if old_from_engine:
            add_mismatch(parts, logprobs, old, mask, algo)
    loss, metrics = compute_policy_loss(
        logprobs,
        old,
        (advantages[index] if advantages.dim() == 1 else advantages[index, :width]).to(device),
        mask,
        algorithm=algo.name,
        clip_low=float(algo.clip_low or 0),
        clip_high=float(algo.clip_high or 0),
        loss_agg=algo.loss_agg,
        normalizer=norm,
        ref_logprobs=None if ref_lp is None else ref_lp[index, :width].to(device),
        kl_coef=0.0 if settings.kl_in_reward else algo.kl_coef,
        kl_estimator=algo.kl_estimator,
        entropy=entropy,
        entropy_coef=algo.entropy_coef,
        token_weights=None if weights is None else weights[index, :width].to(device),
        options=LossOptions(sapo_tau_pos=algo.sapo_tau_pos, sapo_tau_neg=algo.sapo_tau_neg),
        turns=None if turns is None else turns[index, :width].to(device),
    )
    if entropy is not None:
        parts["entropy"].append(float((entropy.detach() * mask).sum() / tokens))
    parts["response_tokens"].append(float(mask.sum()))
    for key, value in metrics.items():
        parts[key].append(value)
    return loss


def minibatch_split(
    num_groups: int, group_size: int, minibatches: int, step_seed: int, group_offset: int = 0
) -> list[torch.Tensor]:
    """Row indices of each minibatch of a batch laid out group by group.

    When `minibatches` divides the group size, every minibatch takes a random equal share of
    every group, drawn per group from (step_seed, global group index): the split is then the
    same whether the groups sit in one process or are spread over ranks. Otherwise the rows
    are shuffled as a whole (one process only).
    """
    n = num_groups * group_size
    if group_size % minibatches:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(step_seed))
        return list(order.split(n // minibatches))
    share = group_size // minibatches
    parts: list[list[torch.Tensor]] = [[] for _ in range(minibatches)]
    for group in range(num_groups):
        generator = torch.Generator().manual_seed(step_seed * 100_003 + group_offset + group)
        perm = torch.randperm(group_size, generator=generator) + group * group_size  # [G]
        for i in range(minibatches):
            parts[i].append(perm[i * share : (i + 1) * share])
    return [torch.cat(p) for p in parts]


def rl_step(
    engine: TrainEngine,
    rollout_engine: RolloutEngine,
    reward: RewardModel,
    prompts: list[list[int]],
    rows: list[dict[str, Any]],
    settings: StepSettings,
    step_seed: int,
    ref_engine: LogprobModel | None = None,
    *,
    seeds: list[int] | None = None,
    ctx: DistContext = LOCAL,
    group_offset: int = 0,
    teacher: Teacher | None = None,
) -> StepOutput:
    """One RL step on this rank's prompts (whole groups): collection, then training."""
    scored = collect_groups(rollout_engine, reward, prompts, rows, settings, seeds, sync=True)
    return train_groups(
        engine, scored, settings, step_seed, ref_engine, ctx=ctx, group_offset=group_offset,
        teacher=teacher,
    )  # fmt: skip


@dataclass
class _Prepared:
    """What the updates of a step read, built once before them."""

    batch: TrainBatch
    splits: list[torch.Tensor]  # row indices of each minibatch
    plan: StepPlan
    routing: StepRouting
    inputs: PiOldInputs
    in_loss: torch.Tensor  # [N] bool: rows in the loss and its normalisers
    advantages: torch.Tensor  # [N]
    ref_lp: torch.Tensor | None = None  # [N, T] the reference policy's (KL penalty)
    kl_metrics: dict[str, float] = field(default_factory=dict)  # KL in the reward
    old: OldPolicy = field(init=False)
    loss_mask: torch.Tensor = field(init=False)  # [N, T] pi_old's mask, rows out of the loss 0
    turns: torch.Tensor | None = None  # [N, T] model turns, with sequence_unit: turn
    token_advantages: torch.Tensor | None = None  # [N, T] with distillation (distill.py)
    distill_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def loss_advantages(self) -> torch.Tensor:
        """`[N]` or `[N, T]`: what the losses take."""
        return self.advantages if self.token_advantages is None else self.token_advantages

    def set_old(self, old: OldPolicy) -> None:
        self.old = old
        self.loss_mask = old.loss_mask * self.in_loss.unsqueeze(1).to(old.loss_mask.dtype)


def _prepare(
    engine: TrainEngine,
    scored: ScoredGroups,
    advantages: torch.Tensor,
    settings: StepSettings,
    step_seed: int,
    ref_engine: LogprobModel | None,
    ctx: DistContext,
    group_offset: int,
    teacher: Teacher | None = None,
) -> _Prepared:
    """Batch, minibatches, micro-batch plan, pi_old and reference log-probs of a step."""
    algo, params = settings.algorithm, settings.sampling
    g, rollout = params.num_samples, scored.rollout
    batch = build_train_batch(rollout, settings.pad_id)
    check_sampled_ids(batch, rollout)  # token in, token out: every step
    n, row_width = batch.input_ids.shape
    if ctx.world > 1 and g % algo.minibatches:
        raise ValueError("with several processes, algorithm.minibatches must divide group_size")
    splits = minibatch_split(n // g, g, algo.minibatches, step_seed, group_offset)
    in_loss = scored.loss_rows(algo.mask_truncated)  # [N]
    plan_for = partial(
        plan_step,
        batch.attention_mask[:, : batch.prompt_width].sum(dim=1),  # [N] prompt lengths
        batch.attention_mask[:, batch.prompt_width :].sum(dim=1),  # [N] response lengths
        splits,
        caps=(
            settings.micro_batch_size or n // algo.minibatches,
            settings.max_tokens_per_micro_batch,
        ),
        ctx=ctx,
        # the engine's log-probs are compared with (or corrected by) pi_old of every row, and a
        # KL in the reward (or distillation) reads pi_old and the reference (teacher) of every row
        forward_all=(
            rollout.completion_logprobs is not None and settings.use_engine_logprobs is False
        )
        or settings.kl_in_reward
        or teacher is not None,
        # [N] groups, where the training forward runs each distinct prompt once
        prompts=torch.arange(n) // g if engine.capabilities.shares_prompts_at(row_width) else None,
    )
    plan = plan_for(rows_with_signal(advantages, settings.skips_zero_advantage) & in_loss)
    temperature = params.temperature
    routing = StepRouting(
        engine.model, algo.routing_replay, n, rollout.routed_experts, algo.router_aux_coef,
        records_routing=engine.capabilities.records_routing,
        measure_volatility=settings.measure_volatility,
        first_row=group_offset * g,
    )  # fmt: skip
    inputs = PiOldInputs(
        engine, batch, plan.forward, temperature, routing, ctx, engine_logprobs_of(rollout, batch)
    )
    prepared = _Prepared(batch, splits, plan, routing, inputs, in_loss, advantages)
    if algo.sequence_unit == "turn":
        prepared.turns = turn_ids(batch.response_mask)
    prepared.set_old(pi_old(inputs, algo, settings.use_engine_logprobs))
    if ref_engine is not None:
        prepared.ref_lp = forward_no_grad(ref_engine, batch, plan.forward, temperature)
    if settings.kl_in_reward and prepared.ref_lp is not None:  # new advantages: plan again
        prepared.advantages, prepared.kl_metrics = kl_reward_advantages(
            torch.tensor(scored.rewards, dtype=torch.float32), prepared.old.logprobs,
            prepared.ref_lp, batch.response_mask, estimator=algo.kl_estimator,
            coef=algo.kl_coef, group_size=g, scale=algo.scale_advantages,
        )  # fmt: skip
        signal = rows_with_signal(prepared.advantages, settings.skips_zero_advantage)  # [N]
        prepared.plan = plan_for(signal & in_loss)
    if teacher is not None and algo.distill is not None:  # per-token advantages: plan again
        if prepared.old.unchecked:  # prepare.py resolves `auto` to a recompute with a teacher
            raise ValueError("distillation needs pi_old of every row before the updates")
        prepared.token_advantages, prepared.distill_metrics = teacher_advantages(
            teacher, algo.distill, batch, prepared.plan.forward, temperature,
            prepared.advantages, prepared.old.logprobs, ctx,
        )  # fmt: skip
        signal = token_signal(prepared.token_advantages, batch.response_mask)  # [N]
        prepared.plan = plan_for(rows_with_signal(signal, settings.skips_zero_advantage) & in_loss)
    return prepared


def train_groups(
    engine: TrainEngine,
    scored: ScoredGroups,
    settings: StepSettings,
    step_seed: int,
    ref_engine: LogprobModel | None = None,
    *,
    ctx: DistContext = LOCAL,
    group_offset: int = 0,
    teacher: Teacher | None = None,
) -> StepOutput:
    """The training phase on this rank's scored groups; losses use global normalisers. With
    `teacher` (algorithm.distill), the advantages are per token (train/step/distill.py)."""
    algo, g = settings.algorithm, settings.sampling.num_samples
    t_start = time.perf_counter()
    # Rewards are shaped here, the one place before the group advantages. The overlong penalty
    # is in `scored.rewards` already (collection: dynamic sampling filters on it).
    # float64, as the KL-in-reward path: the advantages are computed in float64 either way
    reward_t = torch.tensor(scored.rewards, dtype=torch.float64)  # [N]
    advantages = group_advantages(reward_t, g, scale=algo.scale_advantages)  # [N]
    prep = _prepare(
        engine, scored, advantages, settings, step_seed, ref_engine, ctx, group_offset, teacher
    )
    advantages = prep.advantages  # a KL in the reward changes them
    if prep.token_advantages is not None:  # the metrics see each row's mean
        advantages = sequence_view(prep.token_advantages, prep.batch.response_mask)  # [N]
    parts, bad_updates = _updates(engine, prep, settings, ctx)
    old = prep.old
    for key, value in {**old.metrics, "pi_old_from_engine": float(old.from_engine)}.items():
        parts[key].append(value)
    t_train = time.perf_counter() - t_start
    summary = summarise(parts, scored, reward_t, g, advantages, t_train, engine.lr)
    summary.update(shaping_metrics(scored, settings))
    summary.update(prep.routing.metrics(ctx))
    summary.update(scored.reward_metrics)  # reward/<name>/mean of each function
    summary.update(prep.kl_metrics)
    summary.update(prep.distill_metrics)
    summary["bad_updates"] = float(sum(bad_updates))
    # the no-grad passes that ran: pi_old recomputed, the reference policy
    passes = [prep.inputs.plan] * ((not old.from_engine) + (prep.ref_lp is not None))
    summary.update(flop_metrics(engine, scored.rollout, prep.plan, passes, summary, ctx))
    count_skipped_rows(summary, prep.plan, prep.loss_mask, advantages, prep.in_loss)
    # Skipped updates at the end of this step, which continue into the next step's count.
    trailing = next((i for i, bad in enumerate(reversed(bad_updates)) if not bad), len(bad_updates))
    summary["bad_updates_trailing"] = float(trailing)
    return StepOutput(ctx.reduce_metrics(summary), scored.rollout, scored.rewards)


def _updates(
    engine: TrainEngine, prep: _Prepared, settings: StepSettings, ctx: DistContext
) -> tuple[dict[str, list[float]], list[bool]]:
    """The step's optimiser steps, one per minibatch: their metric parts, and per minibatch
    whether the non-finite guard left its update out."""
    algo, temperature = settings.algorithm, settings.sampling.temperature
    batch, routing = prep.batch, prep.routing
    parts: dict[str, list[float]] = defaultdict(list)
    bad_updates: list[bool] = []
    for number, (minibatch, micro_batches) in enumerate(
        zip(prep.splits, prep.plan.minibatches, strict=True)
    ):
        # every row in the loss counts in the normaliser, trained or not: the gradient stays
        agg = resolve_loss_agg(algo.name, algo.loss_agg)  # resolved by the recipe already
        turns = None if prep.turns is None else prep.turns[minibatch]
        norm = ctx.all_reduce_sum(loss_normalizer(prep.loss_mask[minibatch], agg, turns))
        minibatch_loss, bad_minibatch = 0.0, False
        trained = [m.rows for m in micro_batches if not m.filler]
        routing.before_update(
            batch, torch.cat(trained) if trained else torch.tensor([], dtype=torch.long),
            stand_in=int(micro_batches[0].rows[0]),
        )  # fmt: skip
        for part, (index, filler) in enumerate(micro_batches):
            sub = batch.select(index).trimmed()
            width = sub.response_mask.shape[1]
            with routing.training_forward(sub, index) as router_logits:
                logprobs, entropy = engine.logprobs(
                    sub, temperature, entropy=False if filler else settings.entropy_mode
                )
            if prep.old.unchecked:  # `auto`: this forward, before any update, checks the engine's
                prep.set_old(
                    check_first_forward(
                        prep.old, prep.inputs, algo, logprobs, None if filler else index
                    )
                )
            if filler:  # keeps this rank in step with the others; adds nothing
                loss = logprobs.sum() * 0.0
            else:
                loss = _micro_batch_loss(
                    parts, settings, number == 0, prep.old.from_engine, logprobs, entropy, index,
                    width, prep.old.logprobs, prep.ref_lp, prep.loss_advantages, prep.loss_mask,
                    prep.old.weights, norm, prep.turns,
                )  # fmt: skip
                aux = routing.aux_loss(router_logits, sub)
                if aux is not None:  # the minibatch's mean over micro-batches and ranks
                    loss = loss + aux * (len(index) / (len(minibatch) * ctx.world))
                    parts["router_aux_loss"].append(float(aux.detach()))
            finite = ctx.all_reduce_sum(0.0 if torch.isfinite(loss) else 1.0) == 0.0
            # every rank takes the same decision
            engine.backward(loss if finite else None, boundary=part == len(micro_batches) - 1)
            bad_minibatch |= not finite
            minibatch_loss += ctx.all_reduce_sum(float(loss.detach()))  # global normaliser
        parts["loss"].append(minibatch_loss)
        grad_norm, applied = engine.step(skip=bad_minibatch)
        routing.after_update(batch, applied)  # MoE: volatility across this one update
        parts["grad_norm"].append(grad_norm)
        bad_updates.append(not applied)
    return parts, bad_updates
