"""One RL step: collect Q x G scored responses (collection.py), then take `minibatches` optimiser
steps on them (`train_groups`).

The step plans its micro-batches once (micro.py). The no-grad forwards (pi_old, the reference,
a teacher) are planned first: over every row where something reads pi_old of every row, else
over the rows the updates use, whose advantages are then final. The updates are planned once
the advantages are final: a KL in the reward and distillation change them after those forwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from gspo_cli.algorithms import group_advantages
from gspo_cli.algorithms.kl import kl_reward_advantages
from gspo_cli.models.forward.batch import TrainBatch, turn_ids
from gspo_cli.rollout.base import RolloutBatch, RolloutEngine
from gspo_cli.train.engines.distributed import LOCAL, DistContext
from gspo_cli.train.engines.torch_engine import LogprobModel, TrainEngine
from gspo_cli.train.step.collection import collect_groups
from gspo_cli.train.step.distill import Teacher, sequence_view, teacher_advantages
from gspo_cli.train.step.metrics import count_skipped_rows, shaping_metrics, summarise
from gspo_cli.train.step.micro import (
    Layout,
    MicroBatch,
    plan_forward,
    plan_updates,
    rows_used,
    rows_with_signal,
    step_plan,
)
from gspo_cli.train.step.old_policy import PiOldInputs, engine_logprobs_of, forward_no_grad, pi_old
from gspo_cli.train.step.optimiser_steps import PreparedStep, take_optimiser_steps
from gspo_cli.train.step.replay import StepRouting
from gspo_cli.train.step.rewards import WeightedRewards
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.settings import StepOutput, StepSettings
from gspo_cli.train.step.train_batch import build_train_batch, check_sampled_ids
from gspo_cli.train.step.utilisation import flop_metrics


@dataclass(frozen=True)
class StepModels:
    """The models a step's training phase runs: the policy's engine, the KL reference (with a
    KL penalty) and the distillation teacher (with algorithm.distill)."""

    engine: TrainEngine
    reference: LogprobModel | None = None
    teacher: Teacher | None = None


@dataclass(frozen=True)
class RankShare:
    """This rank's part of a step: its place among the ranks, and the batch position of its
    first group (each rank takes whole groups)."""

    ctx: DistContext = LOCAL
    group_offset: int = 0


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
    models: StepModels,
    rollout_engine: RolloutEngine,
    reward: WeightedRewards,
    prompts: list[list[int]],
    rows: list[dict[str, Any]],
    settings: StepSettings,
    step_seed: int,
) -> StepOutput:
    """One RL step on one process's prompts (whole groups): collection, then training."""
    scored = collect_groups(rollout_engine, reward, prompts, rows, settings, sync=True)
    return train_groups(models, scored, settings, step_seed)


def reward_advantages(
    rewards: list[float],
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    settings: StepSettings,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`[N]` the group advantages of the rewards with the KL in them, and its metrics. The
    rewards enter as scored, in float64: kl_reward_advantages computes in float64."""
    algo = settings.algorithm
    return kl_reward_advantages(
        torch.tensor(rewards, dtype=torch.float64), old_logprobs, ref_logprobs, mask,
        estimator=algo.loss.kl.estimator, coef=algo.loss.kl.coef,
        group_size=settings.sampling.num_samples, scale=algo.scale_advantages,
    )  # fmt: skip


def _layout(
    engine: TrainEngine, batch: TrainBatch, settings: StepSettings, ctx: DistContext
) -> Layout:
    """What the step's micro-batches are packed by."""
    n, row_width = batch.input_ids.shape
    g = settings.sampling.num_samples
    return Layout(
        batch.attention_mask[:, : batch.prompt_width].sum(dim=1),  # [N] prompt lengths
        batch.attention_mask[:, batch.prompt_width :].sum(dim=1),  # [N] response lengths
        caps=(
            settings.micro_batch_size or n // settings.algorithm.minibatches,
            settings.max_tokens_per_micro_batch,
        ),
        ctx=ctx,
        # [N] groups, where the training forward runs each distinct prompt once
        prompts=torch.arange(n) // g if engine.capabilities.shares_prompts_at(row_width) else None,
    )


def _forward_all(settings: StepSettings, rollout: RolloutBatch, models: StepModels) -> bool:
    """Whether something reads pi_old of every row: the engine's log-probs compared with (or
    corrected by) it, a KL in the reward or distillation (pi_old and the reference or the
    teacher, before the advantages)."""
    compared = rollout.completion_logprobs is not None and settings.use_engine_logprobs is False
    return compared or settings.algorithm.loss.kl.in_reward or models.teacher is not None


def _prepare(
    models: StepModels,
    scored: ScoredGroups,
    advantages: torch.Tensor,
    settings: StepSettings,
    step_seed: int,
    share: RankShare,
) -> PreparedStep:
    """Batch, minibatches, pi_old and reference log-probs, the final advantages, and the
    step's one plan of micro-batches."""
    algo, g, rollout = settings.algorithm, settings.sampling.num_samples, scored.rollout
    batch = build_train_batch(rollout, settings.pad_id)
    check_sampled_ids(batch, rollout)  # token in, token out: every step
    n = batch.input_ids.shape[0]
    if share.ctx.world > 1 and g % algo.minibatches:
        raise ValueError("with several processes, algorithm.minibatches must divide group_size")
    splits = minibatch_split(n // g, g, algo.minibatches, step_seed, share.group_offset)
    in_loss = scored.loss_rows(algo.mask_truncated)  # [N]
    layout = _layout(models.engine, batch, settings, share.ctx)
    updates: list[list[MicroBatch]] | None = None
    if _forward_all(settings, rollout, models):
        forward = plan_forward(layout)
    else:  # the advantages are final: the forwards take the rows the updates use
        signal = rows_with_signal(advantages, settings.skips_zero_advantage) & in_loss  # [N]
        updates = plan_updates(layout, splits, signal)
        forward = plan_forward(layout, rows_used(updates))
    routing = StepRouting(
        models.engine.model, algo.routing, n, rollout.routed_experts,
        records_routing=models.engine.capabilities.records_routing,
        measure_volatility=settings.measure_volatility,
        first_row=share.group_offset * g,
    )  # fmt: skip
    inputs = PiOldInputs(
        models.engine, batch, forward, settings.sampling.temperature, routing, share.ctx,
        engine_logprobs_of(rollout, batch),
    )  # fmt: skip
    prepared = PreparedStep(batch, splits, routing, inputs, in_loss, advantages)
    if algo.loss.sequence_unit == "turn":
        prepared.turns = turn_ids(batch.response_mask)
    prepared.set_old(pi_old(inputs, algo, settings.use_engine_logprobs))
    if models.reference is not None:
        prepared.ref_lp = forward_no_grad(models.reference, batch, forward, inputs.temperature)
    _final_advantages(prepared, scored.rewards, settings, models.teacher)
    if updates is None:
        updates = plan_updates(layout, splits, prepared.trained(settings.skips_zero_advantage))
    prepared.plan = step_plan(updates, forward)
    return prepared


def _final_advantages(
    prepared: PreparedStep, rewards: list[float], settings: StepSettings, teacher: Teacher | None
) -> None:
    """A KL in the reward gives new advantages, distillation per-token ones (distill.py)."""
    algo = settings.algorithm
    if algo.loss.kl.in_reward and prepared.ref_lp is not None:
        prepared.advantages, prepared.kl_metrics = reward_advantages(
            rewards, prepared.old.logprobs, prepared.ref_lp, prepared.batch.response_mask, settings
        )
    if teacher is not None and algo.distill is not None:
        if prepared.old.unchecked:  # step_settings.py resolves `auto` to a recompute then
            raise ValueError("distillation needs pi_old of every row before the updates")
        prepared.token_advantages, prepared.distill_metrics = teacher_advantages(
            teacher, algo.distill, prepared.inputs, prepared.advantages, prepared.old.logprobs
        )


def train_groups(
    models: StepModels,
    scored: ScoredGroups,
    settings: StepSettings,
    step_seed: int,
    share: RankShare = RankShare(),
) -> StepOutput:
    """The training phase on this rank's scored groups; losses use global normalisers. With
    a teacher (algorithm.distill), the advantages are per token (train/step/distill.py)."""
    g, ctx = settings.sampling.num_samples, share.ctx
    t_start = time.perf_counter()
    # Rewards are shaped here, the one place before the group advantages. The overlong penalty
    # is in `scored.rewards` already (collection: dynamic sampling filters on it).
    # float64, as the KL-in-reward path: the advantages are computed in float64 either way
    reward_t = torch.tensor(scored.rewards, dtype=torch.float64)  # [N]
    advantages = group_advantages(reward_t, g, scale=settings.algorithm.scale_advantages)  # [N]
    prep = _prepare(models, scored, advantages, settings, step_seed, share)
    advantages = prep.advantages  # a KL in the reward changes them
    if prep.token_advantages is not None:  # the metrics see each row's mean
        advantages = sequence_view(prep.token_advantages, prep.batch.response_mask)  # [N]
    parts, bad_updates = take_optimiser_steps(models.engine, prep, settings, ctx)
    old = prep.old
    for key, value in {**old.metrics, "pi_old_from_engine": float(old.from_engine)}.items():
        parts[key].append(value)
    t_train = time.perf_counter() - t_start
    summary = summarise(parts, scored, reward_t, g, advantages, t_train, models.engine.lr)
    summary.update(shaping_metrics(scored, settings))
    summary.update(prep.routing.metrics(ctx))
    summary.update(scored.reward_metrics)  # reward/<name>/mean of each function
    summary.update(prep.kl_metrics)
    summary.update(prep.distill_metrics)
    summary["bad_updates"] = float(sum(bad_updates))
    # the no-grad passes that ran: pi_old recomputed, the reference policy
    passes = [prep.inputs.plan] * ((not old.from_engine) + (prep.ref_lp is not None))
    summary.update(flop_metrics(models.engine, scored.rollout, prep.plan, passes, summary, ctx))
    count_skipped_rows(summary, prep.plan, prep.loss_mask, advantages, prep.in_loss)
    # Skipped updates at the end of this step, which continue into the next step's count.
    trailing = next((i for i, bad in enumerate(reversed(bad_updates)) if not bad), len(bad_updates))
    summary["bad_updates_trailing"] = float(trailing)
    return StepOutput(ctx.reduce_metrics(summary), scored.rollout, scored.rewards)
