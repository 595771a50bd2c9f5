"""Asynchronous rollouts without a worker: the fixed schedule and the saved in-flight batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe import Recipe
from gspo_cli.train.async_rollouts.trainer import in_flight_file, saved_in_flight
from gspo_cli.train.async_rollouts.worker import WorkerPlan
from gspo_cli.train.engines.distributed import LOCAL


def _plan(staleness: int, start: int) -> WorkerPlan:
    recipe = Recipe.model_validate({"rollout": {"max_staleness": staleness}})
    return WorkerPlan(
        recipe, ([], []), [], None, None, None, LOCAL, None, "cpu", start + 1, 10, start, 0, {},
        0,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_no_batch_lags_more_than_n_versions_and_the_pipeline_fills(staleness: int) -> None:
    plan = _plan(staleness, start=0)
    lags = [(step - 1) - plan.version_for(step) for step in range(1, 11)]
    assert max(lags) == staleness and min(lags) == 0
    assert lags[staleness:] == [staleness] * (10 - staleness)  # full pipeline: exactly N behind


def test_a_restarted_worker_samples_from_the_restored_policy_first() -> None:
    plan = _plan(2, start=5)  # after a rollback to step 5
    assert [plan.version_for(step) for step in (6, 7, 8, 9)] == [5, 5, 5, 6]


def test_saved_batches_apply_only_to_a_resume_with_the_same_settings(tmp_path: Path) -> None:
    record = {"max_staleness": 1, "rollbacks": 0, "world": 1, "batches": ["b"]}
    torch.save(record, in_flight_file(tmp_path, 0))
    assert saved_in_flight(tmp_path, 0, 1, 0) == ["b"]
    assert saved_in_flight(tmp_path, 0, 1, 0, world=2) == []  # other ranks' shares
    assert saved_in_flight(tmp_path, 0, 2, 0) == []  # another N: sampled afresh
    assert saved_in_flight(tmp_path, 0, 1, 1) == []  # after a rollback: fresh seeds
    assert saved_in_flight(tmp_path, 1, 1, 0) == []  # nothing saved for that rank


def test_a_corrupted_in_flight_file_is_one_line(tmp_path: Path) -> None:
    in_flight_file(tmp_path, 0).write_bytes(b"not a checkpoint")
    with pytest.raises(GspoError, match=r"rollouts_in_flight_rank0.pt is corrupted"):
        saved_in_flight(tmp_path, 0, 1, 0)
