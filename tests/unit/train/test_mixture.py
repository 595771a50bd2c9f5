"""Several environments in a step: the mixture sampler (one environment is exactly the single-task
sampler; shares follow the weights; state resumes), and the collection (each environment
generates with its own engine and sampling, the batch keeps the draw order, per-environment
metrics are the batch's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gspo_cli.algorithms.advantages import group_advantages
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch, ToolTrace
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.step.collection import PromptSource, collect_step
from gspo_cli.train.step.curriculum import Curriculum, CurriculumSettings
from gspo_cli.train.step.environments import StepEnvironment, environment_means
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.sampler import MixtureSampler, PromptSampler, WeightSchedule
from gspo_cli.train.step.settings import CollectionSettings
from tests.support.rl_helpers import tiny_step

G = 2


def test_one_environment_draws_exactly_as_the_single_task_sampler() -> None:
    single, mixture = PromptSampler(13, seed=5), MixtureSampler([13], [1.0], seed=5)
    assert [single.next(4) for _ in range(9)] == [mixture.next(4) for _ in range(9)]
    assert single.state_dict() == mixture.state_dict()


def test_shares_follow_the_weights_within_one_prompt() -> None:
    sizes, weights = [50, 7, 30, 9], [2.0, 1.0, 1.0, 0.0]
    sampler = MixtureSampler(sizes, weights, seed=0)
    drawn = sampler.next(400)
    counts = [0] * 4
    for k, row in enumerate(drawn, start=1):
        counts[sampler.environment_of(row)] += 1
        for e, weight in enumerate(weights):  # every prefix holds each share to within one
            assert abs(counts[e] - k * weight / sum(weights)) <= 1
    assert counts == [200, 100, 100, 0]  # the weight-0 environment is evaluated only
    small = [row - 50 for row in drawn if sampler.environment_of(row) == 1]
    assert sorted(small[:7]) == list(range(7))  # its own epochs: each row once per epoch


def test_a_resumed_mixture_draws_what_the_uninterrupted_one_would() -> None:
    whole = MixtureSampler([11, 5, 8], [1.0, 0.7, 0.3], seed=3)
    first = whole.next(17)
    state = whole.state_dict()
    rest = whole.next(40)
    resumed = MixtureSampler([11, 5, 8], [1.0, 0.7, 0.3], seed=3)
    resumed.load_state_dict(state)
    assert resumed.next(40) == rest and first != rest[:17]
    with pytest.raises(ValueError, match="the checkpoint's sampler has 3 environments"):
        MixtureSampler([11, 5], [1.0, 1.0], seed=3).load_state_dict(state)


class LabelEngine:
    """Implements `RolloutEngine`: responses name the engine and the row, their length is the
    sampling's max_new_tokens (truncated), and the tool engine's call the tool once."""

    def __init__(self, label: str, tools: bool = False) -> None:
        self.label, self.tools, self.calls = label, tools, 0

    def sync_weights(self) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: Any = None, **_: Any
    ) -> RolloutBatch:
        self.calls += 1
        batch = RolloutBatch([], [], None, [], [])
        for prompt in prompts:
            for j in range(params.num_samples):
                batch.prompt_ids.append(list(prompt))
                batch.completion_ids.append([7] * params.max_new_tokens)
                batch.texts.append(f"{self.label}:{prompt[0]}:{j}")
                batch.truncated.append(True)
        if self.tools:
            n = len(batch.texts)
            batch.from_tool = [[False] * len(ids) for ids in batch.completion_ids]
            batch.tool_traces = [ToolTrace(calls=1) for _ in range(n)]
        return batch


class SampleIndexReward:
    """Sample j of a group scores j (mixed groups); rows with `flat` score 1 throughout."""

    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: Any = None,
        truncated: Any = None,
    ) -> RewardScores:
        scores = [
            1.0 if row.get("flat") else float(text.split(":")[2])
            for text, row in zip(completions, rows, strict=True)
        ]
        return RewardScores(scores, scores, {"reward/index/mean": sum(scores) / len(scores)})


def _environments() -> tuple[list[StepEnvironment], LabelEngine, LabelEngine]:
    plain, tools = LabelEngine("plain"), LabelEngine("tools", tools=True)
    reward = SampleIndexReward()
    return (
        [
            StepEnvironment(
                "a", plain, reward, SamplingParams(max_new_tokens=3, num_samples=G), range(0, 6)
            ),
            StepEnvironment(
                "b", tools, reward, SamplingParams(max_new_tokens=5, num_samples=G), range(6, 9)
            ),
        ],
        plain,
        tools,
    )


def test_each_environment_generates_its_own_and_the_batch_keeps_the_draw_order() -> None:
    environments, plain, tools = _environments()
    sampler = MixtureSampler([6, 3], [2.0, 1.0], seed=0)
    rows = [{"id": k, "flat": k == 7} for k in range(9)]
    prompts = [[k] for k in range(9)]
    how = CollectionSettings(num_prompts=6, per_prompt_seeds=True, round_limit=1)
    settings = tiny_step(sampling=SamplingParams(num_samples=G), collection=how)
    collected = collect_step(PromptSource(prompts, rows, sampler, environments), settings, 1, LOCAL)
    texts = collected.scored.rollout.texts
    assert [int(t.split(":")[1]) for t in texts[::G]] == collected.index  # the draw order
    assert [t.split(":")[0] for t in texts[::G]] == [
        "plain" if row < 6 else "tools" for row in collected.index
    ]
    assert (plain.calls, tools.calls) == (1, 1)  # one generate per environment
    lengths = [len(ids) for ids in collected.scored.rollout.completion_ids[::G]]
    assert lengths == [3 if row < 6 else 5 for row in collected.index]  # its own budget
    traces = collected.scored.rollout.tool_traces
    assert traces is not None and [t.calls for t in traces[::G]] == [
        0 if row < 6 else 1 for row in collected.index
    ]
    b_rows = [row for row in collected.index if row >= 6]
    metrics = collected.metrics
    assert metrics["env/a/batch_share"] == pytest.approx(4 / 6)
    assert metrics["env/b/tool_calls_per_response"] == 1.0
    assert metrics["env/a/response_len_mean"] == 3.0 and metrics["env/b/truncated_frac"] == 1.0
    assert metrics["env/b/zero_signal_group_frac"] == pytest.approx(b_rows.count(7) / len(b_rows))
    assert "env/a/reward/index/mean" in collected.scored.reward_metrics


def test_per_environment_means_add_up_over_ranks() -> None:
    def sums(responses: float, reward: float) -> dict[str, float]:
        return {
            "responses": responses, "reward": reward, "correct": 0.0, "answered": 0.0,
            "measured": 0.0, "tokens": 0.0, "truncated": 0.0, "tool_calls": 0.0,
            "groups": responses / 2, "zero_signal_groups": 0.0,
        }  # fmt: skip

    means = environment_means(
        [{"a": sums(4, 4), "b": sums(2, 0)}, {"a": sums(2, 0), "b": sums(0, 0)}]
    )
    assert means["env/a/reward_mean"] == pytest.approx(4 / 6)  # not the mean of rank means
    assert means["env/a/batch_share"] == pytest.approx(6 / 8)
    assert "env/a/answered" not in means  # the reward measured no answer form


def _curriculum(visits: int = 2, epochs: int = 1) -> Curriculum:
    return Curriculum(CurriculumSettings(visits=visits, set_aside_epochs=epochs))


def test_a_prompt_all_or_never_solved_on_its_last_k_visits_sits_out_n_epochs() -> None:
    curriculum = _curriculum(visits=2, epochs=1)
    curriculum.observe([1, 2, 3], [1.0, 0.0, 0.5], [0, 0, 0])
    assert not any(curriculum.skips(row, 0) for row in (1, 2, 3))  # one visit is not enough
    curriculum.observe([1, 2, 3], [1.0, 0.0, 1.0], [0, 0, 0])
    assert curriculum.metrics()["curriculum_set_aside_new"] == 2
    assert curriculum.skips(1, 1) and curriculum.skips(2, 1) and not curriculum.skips(3, 1)
    assert not curriculum.skips(1, 2)  # back after one whole epoch out
    curriculum.observe([1], [1.0], [2])
    assert not curriculum.skips(1, 2)  # judged afresh: one visit since it came back


def test_the_sampler_passes_over_set_aside_prompts_and_never_stalls() -> None:
    sampler = MixtureSampler([6], [1.0], seed=0, curriculum=_curriculum(visits=1, epochs=5))
    first = sampler.next(6)  # epoch 0, every row once
    sampler.observe(first[:4], [1.0, 0.0, 1.0, 0.0])
    assert sorted(sampler.next(2)) == sorted(first[4:])  # epoch 1: only the two left
    sampler.observe(first[4:], [1.0, 1.0])  # now every row sits out
    drawn = sampler.next(3)
    assert len(drawn) == 3 and sampler.curriculum is not None
    assert sampler.curriculum.metrics()["curriculum_released"] == 6


def test_the_curriculum_resumes_with_the_sampler() -> None:
    def run(resume_at: int | None) -> list[int]:
        sampler = MixtureSampler([9, 4], [2.0, 1.0], seed=1, curriculum=_curriculum(visits=1))
        drawn: list[int] = []
        for step in range(8):
            if step == resume_at:
                state = sampler.state_dict()
                sampler = MixtureSampler([9, 4], [2.0, 1.0], seed=1, curriculum=_curriculum(1))
                sampler.load_state_dict(state)
            rows = sampler.next(3)
            sampler.observe(rows, [[1.0, 0.5, 0.0][row % 3] for row in rows])  # some flat
            drawn += rows
        return drawn

    assert run(None) == run(4)
    sampler = MixtureSampler([9, 4], [2.0, 1.0], seed=1, curriculum=_curriculum(1))
    with pytest.raises(ValueError, match=r"made without data\.curriculum"):
        sampler.load_state_dict(MixtureSampler([9, 4], [2.0, 1.0], seed=1).state_dict())


def test_an_environment_with_larger_rewards_gets_the_same_advantages() -> None:
    """docs/environments.md: groups are one environment each, and each is scaled by its own
    standard deviation: a tenfold reward scale changes nothing; without scaling it does."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    scaled = rewards.clone()
    scaled[4:] *= 10  # the second group: another environment's reward scale
    a, b = group_advantages(rewards, 4), group_advantages(scaled, 4)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(
        group_advantages(rewards, 4, scale=False), group_advantages(scaled, 4, scale=False)
    )


def test_weights_on_a_schedule_move_the_shares_from_first_to_last() -> None:
    schedule = WeightSchedule([3.0, 1.0], [1.0, 3.0], steps=5)
    assert schedule.weights(1) == [3.0, 1.0] and schedule.weights(5) == [1.0, 3.0]
    assert schedule.weights(3) == [2.0, 2.0]
    sampler = MixtureSampler([40, 40], [3.0, 1.0], seed=0, schedule=schedule)
    shares = []
    for step in range(1, 6):
        sampler.at_step(step)
        rows = sampler.next(8)
        shares.append(sum(sampler.environment_of(row) == 1 for row in rows))
    assert shares[0] == 2 and shares[-1] == 6 and shares == sorted(shares)
