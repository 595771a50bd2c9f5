"""DAPO dynamic sampling: the group filter, the rounds, the sampler position, the short batch,
and the batch's independence of the number of ranks (ranks simulated by threads)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.rollout import MAX_DYNAMIC_SAMPLING_ROUNDS
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.distributed import LOCAL, DistContext
from gspo_cli.train.step.collection import (
    Collected,
    PromptSource,
    collect_step,
    mixed_groups,
    round_seed,
    short_notice,
)
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.sampler import MixtureSampler
from gspo_cli.train.step.settings import CollectionSettings, StepSettings
from tests.support.rl_helpers import one_environment, tiny_step

G, Q, ROWS = 2, 4, 10
# PromptSampler(10, seed=0) draws 4, 1, 7, 5 | 3, 9, 0, 8 | 6, 2, then a new epoch.
ORDER = [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]
PARAMS = SamplingParams(max_new_tokens=8, num_samples=G)


class RowEngine:
    """Implements `RolloutEngine`: the prompt is [data row]; sample j's text names its row, its
    prompt seed and j, so that a test can see which seed produced it."""

    def sync_weights(self) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        **_: object,
    ) -> RolloutBatch:
        batch = RolloutBatch([], [], None, [], [])
        for i, prompt in enumerate(prompts):
            for j in range(params.num_samples):
                seed = None if seeds is None else seeds[i]
                batch.prompt_ids.append(list(prompt))
                batch.completion_ids.append([5] * (3 + j))
                batch.texts.append(f"{prompt[0]}:{seed}:{j}")
                batch.truncated.append(False)
        return batch


class SomeUniformReward:
    """Rows in `uniform` score 1 for every sample; the others 0 and 1 alternately (mixed)."""

    def __init__(self, uniform: set[int]) -> None:
        self.uniform = uniform

    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: Any = None,
        truncated: Any = None,
    ) -> RewardScores:
        scores = [
            1.0 if row["id"] in self.uniform else float(int(text.split(":")[2]) % 2)
            for text, row in zip(completions, rows, strict=True)
        ]
        return RewardScores(scores, scores, {"reward/fake/mean": sum(scores) / len(scores)})


def _source(
    problems: tuple[list[list[int]], list[dict[str, Any]]],
    sampler: MixtureSampler,
    uniform: set[int],
) -> PromptSource:
    """The rows `problems` as one environment with a RowEngine and SomeUniformReward(uniform)."""
    env = one_environment(RowEngine(), SomeUniformReward(uniform), len(problems[0]), PARAMS)
    return PromptSource(*problems, sampler, [env])


def _settings(dynamic: bool = False, max_rounds: int = 1) -> StepSettings:
    """A step of Q prompts, each seeded on its own, with dynamic sampling or not."""
    params = PARAMS
    how = CollectionSettings(
        num_prompts=Q, per_prompt_seeds=True, dynamic=dynamic, max_rounds=max_rounds,
        round_limit=MAX_DYNAMIC_SAMPLING_ROUNDS,
    )  # fmt: skip
    return tiny_step(sampling=params, collection=how)


def _collect(
    uniform: set[int],
    max_rounds: int,
    ctx: DistContext = LOCAL,
    note: Callable[[str], None] | None = None,
) -> tuple[Collected, MixtureSampler]:
    sampler = MixtureSampler([ROWS], [1.0], seed=0)
    problems = ([[k] for k in range(ROWS)], [{"id": k} for k in range(ROWS)])
    settings = _settings(dynamic=True, max_rounds=max_rounds)
    collected = collect_step(
        _source(problems, sampler, uniform), settings, 11,
        ctx, note,
    )  # type: ignore[arg-type]  # fmt: skip
    return collected, sampler


def _rows_of(collected: Collected) -> list[int]:
    return [int(t.split(":")[0]) for t in collected.scored.rollout.texts[::G]]


def test_the_group_filter_matches_a_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    for group_size in (1, 2, 3, 5):
        rewards = torch.randint(0, 2, (7 * group_size,), generator=generator).float()  # [N]
        expected = []
        for start in range(0, len(rewards), group_size):
            group = rewards[start : start + group_size].tolist()
            expected.append(len(group) == 1 or any(r != group[0] for r in group))
        assert mixed_groups(rewards, group_size).tolist() == expected
    assert mixed_groups(torch.tensor([0.5, 0.5, -1.0, 2.0]), 2).tolist() == [False, True]


def test_rounds_refill_the_batch_with_mixed_groups_only() -> None:
    # round 1 draws 4 1 7 5: 1 and 5 uniform, keep 4 7; round 2 draws 3 9 0 8: 3 uniform,
    # keep 9 0 (the batch is full), 8 is surplus: discarded, yet drawn
    collected, sampler = _collect({1, 5, 3}, max_rounds=5)
    assert _rows_of(collected) == collected.index == [4, 7, 9, 0]
    scored = collected.scored
    assert len(scored.rewards) == Q * G and scored.in_loss == [True] * Q
    assert mixed_groups(torch.tensor(scored.rewards), G).all()
    assert sampler.state_dict() == {"epoch": 0, "position": 8}
    assert collected.metrics == {
        "reward_mean": 11 / 16,  # every response generated, both rounds: 6/8 then 5/8
        "accuracy": 11 / 16,
        "dynamic_sampling_rounds": 2.0,
        "dynamic_sampling_kept_groups": 4.0,
        "dynamic_sampling_refill_frac": 0.5,
        "dynamic_sampling_mixed_frac": 5 / 8,
        "dynamic_sampling_short": 0.0,
    }
    # each round samples with its own seeds: round 2's prompts 1 and 2 (rows 9 and 0)
    seeds = [int(t.split(":")[1]) for t in scored.rollout.texts[::G]]
    assert seeds == [11 * 7919 + 0, 11 * 7919 + 2] + [round_seed(11, 1) * 7919 + i for i in (1, 2)]
    assert scored.reward_metrics == {"reward/fake/mean": pytest.approx((0.75 + 0.625) / 2)}


def test_out_of_rounds_the_batch_is_filled_with_dropped_groups_out_of_the_loss() -> None:
    collected, sampler = _collect({1, 5, 3, 9, 0, 8}, max_rounds=2)
    assert _rows_of(collected) == collected.index == [4, 7, 1, 5]  # the first dropped fill it
    assert collected.scored.in_loss == [True, True, False, False]
    rows = collected.scored.loss_rows(mask_truncated=False)
    assert rows.tolist() == [True] * 2 * G + [False] * 2 * G
    assert sampler.state_dict() == {"epoch": 0, "position": 8}
    metrics = collected.metrics
    assert metrics["dynamic_sampling_short"] == 1.0
    assert metrics["dynamic_sampling_kept_groups"] == 2.0
    assert metrics["dynamic_sampling_rounds"] == 2.0
    line = short_notice(3, metrics, 2)
    assert line is not None and "step 3" in line and "kept 2 groups" in line
    assert short_notice(3, {"dynamic_sampling_short": 0.0}, 2) is None


def test_each_refill_round_prints_a_line() -> None:
    lines: list[str] = []
    _collect({1, 5, 3}, max_rounds=5, note=lines.append)  # full after round 2
    assert lines == ["dynamic sampling: round 2/5, 4/4 groups with mixed rewards so far"]
    lines.clear()
    _collect({1, 5, 3, 9, 0, 8}, max_rounds=2, note=lines.append)  # short: 2 of 4
    assert lines == ["dynamic sampling: round 2/2, 2/4 groups with mixed rewards so far"]


def test_rounds_that_keep_no_group_end_the_run_naming_the_limit() -> None:
    lines: list[str] = []
    with pytest.raises(GspoError) as caught:
        _collect(set(range(ROWS)), max_rounds=3, note=lines.append)  # every group uniform
    message = str(caught.value)
    assert "no group with mixed rewards in 3 rounds" in message
    assert "rollout.dynamic_sampling_max_rounds" in message and "\n" not in message
    assert [line.split(",")[0] for line in lines] == [
        "dynamic sampling: round 2/3",
        "dynamic sampling: round 3/3",
    ]


@dataclass(frozen=True)
class ThreadContext(DistContext):
    """Ranks as threads: `all_gather` meets the other threads at a barrier."""

    slots: Any = None
    barrier: Any = None

    def all_gather(self, value: Any) -> list[Any]:
        self.slots[self.rank] = value
        self.barrier.wait()
        gathered = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return gathered


def test_two_ranks_train_the_batch_one_rank_would() -> None:
    # batch positions 1 (row 7, generated by rank 1) and 2 (row 9, by rank 0) change rank
    one, _ = _collect({1, 5, 3}, max_rounds=5)
    slots: list[Any] = [None, None]
    barrier = threading.Barrier(2)
    results: list[Any] = [None, None]

    def rank(r: int) -> None:
        results[r] = _collect({1, 5, 3}, 5, ThreadContext(r, 2, r, slots, barrier))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    (zero, sampler0), (first, sampler1) = results
    assert (zero.group_offset, first.group_offset) == (0, 2)
    assert zero.index == first.index == one.index
    texts = zero.scored.rollout.texts + first.scored.rollout.texts
    assert texts == one.scored.rollout.texts  # same prompts, same seeds, same order
    assert zero.scored.rewards + first.scored.rewards == one.scored.rewards
    assert zero.metrics == first.metrics == one.metrics
    assert sampler0.state_dict() == sampler1.state_dict() == {"epoch": 0, "position": 8}


def test_without_dynamic_sampling_one_round_keeps_every_group() -> None:
    sampler = MixtureSampler([ROWS], [1.0], seed=0)
    problems = ([[k] for k in range(ROWS)], [{"id": k} for k in range(ROWS)])
    collected = collect_step(
        _source(problems, sampler, {1}),
        _settings(), 11, LOCAL,
    )  # type: ignore[arg-type]  # fmt: skip
    assert _rows_of(collected) == ORDER[:Q] and collected.metrics == {}
    assert sampler.state_dict()["position"] == Q
