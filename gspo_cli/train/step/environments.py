"""A step's environments: each generates and scores its own prompts, and the batch keeps the
draw order (train/step/collection.py collects rounds of it).

An environment (recipe `environments`, docs/environments.md) has its own rollout engine (the
run's, with its tools when it has some), its own weighted rewards and its own sampling (its
response budget). Group advantages stay within a group: one prompt, so one environment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rollout.base import EngineSpec, RolloutEngine, SamplingParams
from gspo_cli.rollout.batch import ToolTrace
from gspo_cli.rollout.engines import with_tools
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.train.step.rewards import RewardSection, WeightedRewards
from gspo_cli.train.step.scored import ScoredGroups

ENV_PREFIX = "env/"  # metrics.jsonl keys of one environment: env/NAME/...


@dataclass(frozen=True)
class EnvironmentPlan:
    """One environment in plain values (train/run/environments.py builds them from the recipe;
    the rollout worker of asynchronous rollouts gets them pickled)."""

    name: str
    tools: ToolSettings | None
    reward: RewardSection
    sampling: SamplingParams
    rows: range


@dataclass(frozen=True)
class StepEnvironment:
    """One environment as the step sees it."""

    name: str
    rollout: RolloutEngine  # the run's engine, wrapped with this environment's tools if any
    reward: WeightedRewards
    sampling: SamplingParams  # the run's, with this environment's max_new_tokens
    rows: range  # its rows in the run's row list (MixtureSampler.offsets)


def open_environments(
    plans: Sequence[EnvironmentPlan],
    engine: RolloutEngine,
    spec: EngineSpec,
    services: RewardServices,
) -> list[StepEnvironment]:
    """Each plan's environment on the run's one rollout engine (wrapped for its tools) with its
    own rewards; `close_environments` closes the rewards (the engine is the caller's)."""
    return [
        StepEnvironment(
            plan.name,
            engine if plan.tools is None else with_tools(engine, spec, plan.tools),
            WeightedRewards(plan.reward, services),
            plan.sampling,
            plan.rows,
        )
        for plan in plans
    ]


def close_environments(environments: Sequence[StepEnvironment]) -> None:
    for env in environments:
        env.reward.close()


def environment_at(environments: Sequence[StepEnvironment], row: int) -> int:
    """The position in `environments` of the one holding run row `row`."""
    for e, env in enumerate(environments):
        if row in env.rows:
            return e
    raise IndexError(f"row {row} belongs to no environment")


def environment_metrics(
    environments: Sequence[StepEnvironment], index: list[int], scored: ScoredGroups, offset: int
) -> dict[str, dict[str, float]]:
    """Per environment, sums over this rank's responses (groups `offset ..` of batch `index`);
    `environment_means` turns every rank's sums into env/NAME/... metrics."""
    g, rollout = scored.group_size, scored.rollout
    sums = {env.name: dict.fromkeys(SUMS, 0.0) for env in environments}
    for group in range(len(scored.in_loss)):
        total = sums[environments[environment_at(environments, index[offset + group])].name]
        rows = range(group * g, (group + 1) * g)
        total["groups"] += 1
        total["zero_signal_groups"] += float(g > 1 and len({scored.rewards[r] for r in rows}) == 1)
        for r in rows:
            total["responses"] += 1
            total["reward"] += scored.rewards[r]
            total["correct"] += scored.correct[r]
            answered = math.nan if scored.answered is None else scored.answered[r]
            if not math.isnan(answered):  # the environment's reward measures answer forms
                total["answered"] += answered
                total["measured"] += 1
            total["tokens"] += len(rollout.completion_ids[r])
            total["truncated"] += float(rollout.truncated[r])
            total["tool_calls"] += (
                0 if rollout.tool_traces is None else rollout.tool_traces[r].calls
            )
    return sums


SUMS = (
    "responses", "reward", "correct", "answered", "measured", "tokens", "truncated", "tool_calls",
    "groups", "zero_signal_groups",
)  # fmt: skip
# env/NAME/<metric> = sum of <numerator> over sum of <denominator>
MEANS = {
    "reward_mean": ("reward", "responses"),
    "accuracy": ("correct", "responses"),
    "answered": ("answered", "measured"),
    "response_len_mean": ("tokens", "responses"),
    "truncated_frac": ("truncated", "responses"),
    "tool_calls_per_response": ("tool_calls", "responses"),
    "zero_signal_group_frac": ("zero_signal_groups", "groups"),
}


def environment_means(gathered: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """env/NAME/... metrics from every rank's `environment_metrics` sums: the MEANS
    (zero_signal_group_frac: the share of its groups whose rewards are all equal) and
    batch_share (its share of the step's responses)."""
    names = list(dict.fromkeys(name for part in gathered for name in part))
    totals = {name: {k: sum(part[name][k] for part in gathered) for k in SUMS} for name in names}
    everything = sum(t["responses"] for t in totals.values())
    out: dict[str, float] = {}
    for name, t in totals.items():
        key = f"{ENV_PREFIX}{name}/"
        out[f"{key}batch_share"] = t["responses"] / max(everything, 1.0)
        if not t["responses"]:
            continue
        for metric, (numerator, denominator) in MEANS.items():
            if t[denominator]:  # answered: only where the reward measures it
                out[f"{key}{metric}"] = t[numerator] / t[denominator]
    return out


def with_tool_fields(scored: ScoredGroups) -> ScoredGroups:
    """`scored` with tool fields filled (no tool tokens, no calls) when its environment has no
    tools, so that a batch mixing tool and plain environments joins."""
    rollout = scored.rollout
    if rollout.tool_traces is not None:
        return scored
    rollout.from_tool = [[False] * len(ids) for ids in rollout.completion_ids]
    rollout.tool_traces = [ToolTrace() for _ in rollout.completion_ids]
    return scored
