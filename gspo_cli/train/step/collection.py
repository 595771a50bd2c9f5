"""A step's collection phase: G responses per prompt generated and scored (`collect_groups`,
one round of one environment; `collect_mixed`, each environment its own prompts), in rounds with
DAPO dynamic sampling (`collect_step`; arXiv 2503.14476, Sec. 3.2).

Without dynamic sampling a step draws `rollout.num_prompts` (Q) prompts and each rank generates
and scores its share, Q / world whole groups. With it, the step runs rounds: each round draws Q
more prompts from the (replicated) sampler, each rank generates and scores its share with seeds
of that round, and the ranks exchange which groups have mixed rewards. The batch is the first Q
mixed groups in draw order (round, then prompt); the rounds stop once there are Q of them, or
after `rollout.dynamic_sampling_max_rounds`. A group of one response is kept (verl's rule).

- Every decision is taken on the gathered flags, so every rank runs the same rounds (in
  lock-step, as ZeRO-3 generation needs) and the batch does not depend on the world size: batch
  position p goes to rank p // (Q / world), as without dynamic sampling, and a kept group that
  another rank generated travels to it (one all-gather per step).
- Short after the last round, the step trains on the K < Q groups it kept. The batch keeps its
  Q groups (shapes, minibatches and the ranks' shares as usual) by filling it with the first
  dropped groups, marked out of the loss: loss mask 0, so they add nothing to the loss or to its
  normalisers (and, all-equal, their advantages are 0 anyway). The update is DAPO's objective
  over the K kept groups. The loop prints a notice and `dynamic_sampling_short` is 1. With
  K = 0 there is nothing to train on: the run ends with one line (as verl's recipe does), as a
  constant reward would otherwise spend every step's rounds for nothing.
- Every round after the first prints a line (round k, groups kept so far / needed).
- Surplus mixed groups beyond Q are discarded, as the DAPO recipe does; every drawn prompt
  stays drawn: the sampler's position (checkpointed) accounts for all of them, so a resumed run
  draws what the uninterrupted one would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gspo_cli.algorithms.advantages import zero_signal_groups
from gspo_cli.algorithms.overlong import overlong_penalty
from gspo_cli.core.errors import GspoError
from gspo_cli.rewards.environment import ENVIRONMENT_REWARD
from gspo_cli.rollout.base import RolloutEngine
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.step.environments import (
    ENV_PREFIX,
    StepEnvironment,
    environment_at,
    environment_means,
    environment_metrics,
    with_tool_fields,
)
from gspo_cli.train.step.rewards import WeightedRewards
from gspo_cli.train.step.sampler import MixtureSampler
from gspo_cli.train.step.scored import ScoredGroups, concat_groups, select_groups
from gspo_cli.train.step.settings import CollectionSettings, StepSettings

# Seeds of round r > 0 are the step's seed plus r x this prime: far from every other step's seed
# (steps, rollbacks and the trainer seed move the step seed by far less).
ROUND_SEED_STRIDE = 1_000_000_007
PROMPT_SEED_STRIDE = 7919  # prompt i of a round samples with seed round_seed x this + i


@dataclass(frozen=True)
class PromptSource:
    """Where a step draws its prompts from: the run's prompts and data rows (every environment's,
    one after the other), the sampler whose position (checkpointed) says which come next, and
    the environments that generate and score them."""

    prompts: list[list[int]]
    rows: list[dict[str, Any]]
    sampler: MixtureSampler
    environments: Sequence[StepEnvironment]


@dataclass
class Collected:
    scored: ScoredGroups  # this rank's groups, ready to train
    index: list[int]  # [Q] the data rows of the batch's groups, in batch order (every rank)
    group_offset: int  # the batch position of this rank's first group
    metrics: dict[str, float] = field(default_factory=dict)  # the same on every rank


@dataclass
class _Round:
    index: list[int]  # [Q] data rows drawn
    scored: ScoredGroups  # this rank's share of them
    mixed: list[bool]  # [Q] groups with mixed rewards, over all ranks
    totals: tuple[float, float, int]  # sums of rewards and of correct, responses: all ranks


def step_seed(seed: int, step: int, rollbacks: int) -> int:
    """The sampling seed of RL step `step` of a run seeded `seed` (trainer.seed); after a
    rollback the retried steps draw other samples (`rollbacks` enters it)."""
    return seed * 1_000_003 + step + 7_919_111 * rollbacks


def round_seed(step_seed: int, number: int) -> int:
    """The sampling seed of round `number` (0 first) of a step: round 0 keeps the step's, so a
    step without dynamic sampling samples as it always did."""
    return step_seed + ROUND_SEED_STRIDE * number


def mixed_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[Q]` bool of rewards `[N]` (group by group): True for the groups dynamic sampling keeps,
    those whose rewards are not all equal, and any group of one response (verl's rule)."""
    if group_size == 1:
        return torch.ones(rewards.numel(), dtype=torch.bool)
    return ~zero_signal_groups(rewards, group_size)


def collect_groups(
    rollout_engine: RolloutEngine,
    reward: WeightedRewards,
    prompts: list[list[int]],
    rows: list[dict[str, Any]],
    settings: StepSettings,
    seeds: list[int] | None = None,
    *,
    sync: bool = True,
) -> ScoredGroups:
    """One round of collection: G responses per prompt, scored, with DAPO's overlong penalty
    added here (dynamic sampling filters on the reward the advantages will see). `sync`: make
    the engine take the trainer's weights first (once per step; its time counts as rollout)."""
    params = settings.sampling
    t0 = time.perf_counter()
    if sync:
        rollout_engine.sync_weights()
    rollout = rollout_engine.generate(prompts, params, seeds, rows=rows)
    t_rollout = time.perf_counter()
    response_rows = [row for row in rows for _ in range(params.num_samples)]
    if rollout.tool_traces is not None:  # a tool environment's own score, for `environment`
        response_rows = [
            {**row, ENVIRONMENT_REWARD: trace.environment_reward}
            for row, trace in zip(response_rows, rollout.tool_traces, strict=True)
        ]
    scores = reward(rollout.texts, response_rows, rollout.completion_ids, rollout.truncated)
    lengths = torch.tensor([len(c) for c in rollout.completion_ids])  # [N]
    overlong = overlong_penalty(
        lengths, params.max_new_tokens, settings.overlong_buffer, settings.overlong_penalty
    ).tolist()  # [N], all 0.0 when off
    rewards = [r + p for r, p in zip(scores.totals, overlong, strict=True)]
    return ScoredGroups(
        rollout, rewards, scores.correct, overlong, [True] * len(prompts), scores.metrics,
        t_rollout - t0, time.perf_counter() - t_rollout, scores.answered, scores.correct_any_form,
    )  # fmt: skip


def collect_mixed(
    environments: Sequence[StepEnvironment],
    index: list[int],
    prompts: list[list[int]],
    rows: list[dict[str, Any]],
    settings: StepSettings,
    seeds: list[int] | None,
    *,
    sync: bool,
) -> ScoredGroups:
    """The groups of run rows `index` (with their `prompts` and `rows`), in that order: each
    environment generates and scores its own at once, with its sampling."""
    labels = [environment_at(environments, row) for row in index]  # [groups]
    parts: dict[int, ScoredGroups] = {}
    for e in dict.fromkeys(labels):  # environments in first-drawn order
        mine = [i for i, label in enumerate(labels) if label == e]
        env = environments[e]
        parts[e] = collect_groups(
            env.rollout,
            env.reward,
            [prompts[i] for i in mine],
            [rows[i] for i in mine],
            replace(settings, sampling=env.sampling),
            None if seeds is None else [seeds[i] for i in mine],
            sync=sync and not parts,  # the environments share one engine's weights
        )
    if len({environments[e].sampling.temperature for e in parts}) > 1:  # the trainer's too
        for e, part in parts.items():
            part.rollout.temperatures = [environments[e].sampling.temperature] * len(part.rewards)
    if len(parts) == 1:
        return parts[labels[0]]
    return _in_draw_order(environments, labels, parts)


def _in_draw_order(
    environments: Sequence[StepEnvironment], labels: list[int], parts: dict[int, ScoredGroups]
) -> ScoredGroups:
    """One batch of each environment's groups, back in draw order; reward metrics per
    environment (env/NAME/reward/...)."""
    taken = dict.fromkeys(parts, 0)
    ordered = []
    for label in labels:
        ordered.append(with_tool_fields(select_groups(parts[label], [taken[label]])))
        taken[label] += 1
    metrics = {
        f"{ENV_PREFIX}{environments[e].name}/{key}": value
        for e, part in parts.items()
        for key, value in part.reward_metrics.items()
    }
    times = (
        sum(p.time_rollout_s for p in parts.values()),
        sum(p.time_reward_s for p in parts.values()),
    )
    return concat_groups(ordered, metrics, times)


def collect_step(
    source: PromptSource,
    settings: StepSettings,
    step_seed: int,
    ctx: DistContext,
    note: Callable[[str], None] | None = None,
    *,
    step: int | None = None,
) -> Collected:
    """This rank's scored groups of a step, and the batch's data rows, drawn from `source` as
    `settings.collection` says. `note` gets a line per round after the first (no silent
    refills); GspoError when the rounds kept no group at all. `step`: the RL step, for
    environment weights on a schedule (None: the weights as they are)."""
    if step is not None:
        source.sampler.at_step(step)  # environment weights on a schedule
    how, prompts, rows = settings.collection, source.prompts, source.rows
    q = how.num_prompts
    q_local = q // ctx.world
    mine = range(ctx.rank * q_local, (ctx.rank + 1) * q_local)
    rounds: list[_Round] = []
    kept = 0
    for number in range(how.max_rounds if how.dynamic else 1):
        index = source.sampler.next(q)  # the same on every rank
        seed = round_seed(step_seed, number)
        scored = collect_mixed(
            source.environments,
            [index[i] for i in mine],
            [prompts[index[i]] for i in mine],
            [rows[index[i]] for i in mine],
            settings,
            [seed * PROMPT_SEED_STRIDE + i for i in mine] if how.per_prompt_seeds else None,
            sync=number == 0,  # the weights do not change between rounds
        )
        _observe(source, index, scored, ctx)
        if not how.dynamic:
            return _per_environment(Collected(scored, index, mine.start), source, ctx)
        flags = mixed_groups(torch.tensor(scored.rewards), scored.group_size).tolist()  # [Q/W]
        sums = (sum(scored.rewards), sum(scored.correct), len(scored.rewards))
        gathered = ctx.all_gather((flags, sums))
        mixed = [flag for part, _ in gathered for flag in part]  # [Q] rank order
        totals = (
            sum(t[0] for _, t in gathered),
            sum(t[1] for _, t in gathered),
            sum(t[2] for _, t in gathered),
        )
        rounds.append(_Round(index, scored, mixed, totals))
        kept = sum(sum(r.mixed) for r in rounds)
        if number > 0 and note is not None:
            note(round_line(number + 1, how.max_rounds, kept, q))
        if kept >= q:
            break
    if kept == 0:  # the same on every rank: the flags were gathered
        raise GspoError(nothing_kept(len(rounds), how))
    return _per_environment(_assemble(rounds, q, ctx), source, ctx)


def _observe(
    source: PromptSource, index: list[int], scored: ScoredGroups, ctx: DistContext
) -> None:
    """Every rank's groups of a round and their pass rates (share of correct responses) to the
    sampler's curriculum, if it has one (one all-gather with several ranks)."""
    if source.sampler.curriculum is None:
        return
    g = scored.group_size
    mine = [sum(scored.correct[i * g : (i + 1) * g]) / g for i in range(len(scored.in_loss))]
    rates = [rate for part in ctx.all_gather(mine) for rate in part]  # [Q] batch order
    source.sampler.observe(index, rates)


def _per_environment(collected: Collected, source: PromptSource, ctx: DistContext) -> Collected:
    """`collected` with the curriculum's metrics, and the batch's env/NAME/... metrics when the
    run has several environments (one all-gather with several ranks)."""
    if source.sampler.curriculum is not None:
        collected.metrics.update(source.sampler.curriculum.metrics())
    if len(source.environments) < 2:
        return collected
    sums = environment_metrics(
        source.environments, collected.index, collected.scored, collected.group_offset
    )
    collected.metrics.update(environment_means(ctx.all_gather(sums)))
    return collected


def round_line(number: int, max_rounds: int, kept: int, q: int) -> str:
    """The console line of a refill round (`number` from 1; the first is not a refill)."""
    return (
        f"dynamic sampling: round {number}/{max_rounds}, {min(kept, q)}/{q} groups with mixed "
        "rewards so far"
    )


def nothing_kept(rounds: int, how: CollectionSettings) -> str:
    """The error of a step whose rounds found no group with mixed rewards: it has nothing to
    train on, and a run where this happens most likely has a reward that cannot tell its
    completions apart."""
    q = how.num_prompts
    return (
        f"dynamic sampling found no group with mixed rewards in {rounds} rounds of {q} prompts "
        f"(rollout.dynamic_sampling_max_rounds {rounds}): every group's rewards were equal, so "
        "the step has nothing to train on. Check that the reward tells completions apart "
        "(a constant reward, or prompts all too easy or too hard for the model), or raise "
        f"rollout.dynamic_sampling_max_rounds (at most {how.round_limit})"
    )


def _assemble(rounds: list[_Round], q: int, ctx: DistContext) -> Collected:
    """The batch: the first Q mixed groups, filled (out of the loss) with dropped ones when
    short; this rank's share of it, and the step's dynamic sampling metrics."""
    drawn = [(r, i) for r in range(len(rounds)) for i in range(q)]  # (round, group) draw order
    kept = [(r, i) for r, i in drawn if rounds[r].mixed[i]]
    used = kept[:q]
    dropped = [(r, i) for r, i in drawn if not rounds[r].mixed[i]]
    chosen = used + dropped[: q - len(used)]  # [Q]
    in_loss = [True] * len(used) + [False] * (q - len(used))
    q_local = q // ctx.world
    groups = _share(rounds, chosen, in_loss, q_local, ctx)
    metrics_by_round = [r.scored.reward_metrics for r in rounds]
    reward_metrics = {  # over every completion the step generated
        key: sum(m[key] for m in metrics_by_round if key in m)
        / sum(1 for m in metrics_by_round if key in m)
        for key in dict.fromkeys(k for m in metrics_by_round for k in m)
    }
    times = (
        sum(r.scored.time_rollout_s for r in rounds),
        sum(r.scored.time_reward_s for r in rounds),
    )
    generated = sum(r.totals[2] for r in rounds)
    metrics = {
        # Over every response the step generated, not the filtered batch (whose mean describes
        # the filter): the guards' reward-crash check reads these.
        "reward_mean": sum(r.totals[0] for r in rounds) / generated,
        "accuracy": sum(r.totals[1] for r in rounds) / generated,
        "dynamic_sampling_rounds": float(len(rounds)),
        "dynamic_sampling_kept_groups": float(len(used)),
        "dynamic_sampling_refill_frac": sum(1 for r, _ in used if r > 0) / q,
        "dynamic_sampling_mixed_frac": len(kept) / len(drawn),
        "dynamic_sampling_short": float(len(used) < q),
    }
    return Collected(
        concat_groups(groups, reward_metrics, times),
        [rounds[r].index[i] for r, i in chosen],
        ctx.rank * q_local,
        metrics,
    )


def _share(
    rounds: list[_Round],
    chosen: list[tuple[int, int]],
    in_loss: list[bool],
    q_local: int,
    ctx: DistContext,
) -> list[ScoredGroups]:
    """This rank's groups of the batch (positions rank x q_local onwards), one per position:
    its own, and those other ranks generated, which they send in one all-gather."""

    def owned(position: int) -> ScoredGroups:  # a group this rank generated
        r, i = chosen[position]
        return select_groups(rounds[r].scored, [i - ctx.rank * q_local], in_loss[position])

    def generator(position: int) -> int:  # the rank that generated a batch position's group
        return chosen[position][1] // q_local

    outgoing = {
        p: owned(p)
        for p in range(len(chosen))
        if generator(p) == ctx.rank and p // q_local != ctx.rank
    }
    incoming: dict[int, ScoredGroups] = {}
    for part in ctx.all_gather(outgoing):  # every rank takes part, even with nothing to send
        incoming.update(part)
    mine = range(ctx.rank * q_local, (ctx.rank + 1) * q_local)
    return [owned(p) if generator(p) == ctx.rank else incoming[p] for p in mine]


def short_notice(step: int, metrics: dict[str, float], max_rounds: int) -> str | None:
    """The console line of a step that ran out of rounds before its batch was full."""
    if not metrics.get("dynamic_sampling_short"):
        return None
    kept = int(metrics["dynamic_sampling_kept_groups"])
    return (
        f"step {step}: dynamic sampling kept {kept} groups with mixed rewards after "
        f"{max_rounds} rounds (rollout.dynamic_sampling_max_rounds), short of a full batch: "
        f"training on those {kept}"
    )
