"""What a user's reward starts in a session of its own (`start_new_session=True`, out of its
worker's process group) still ends with the worker: at a normal close, after a timeout, and
when the trainer is SIGKILLed (core/workers.py `kill_tagged`). Waits are bounded, not timed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gspo_cli.rewards.contract import RewardTimeout
from gspo_cli.rewards.worker import RewardWorker, WorkerFunction
from tests.support.helpers import REPO, kill_marked, marked, survivors_of_sigkill, wait_gone


def spawn_in_new_session(marker: str, sleep_s: float) -> list[float]:
    subprocess.Popen(["sleep", marker], start_new_session=True)
    time.sleep(sleep_s)
    return [1.0]


@pytest.mark.parametrize(("sleep_s", "marker"), [(0.0, "987671"), (30.0, "987672")])
def test_what_a_reward_started_in_its_own_session_ends_with_the_worker(
    sleep_s: float, marker: str
) -> None:
    worker = RewardWorker([WorkerFunction(spawn_in_new_session, None)])
    try:
        if sleep_s:  # killed at its deadline
            with pytest.raises(RewardTimeout):
                worker.call(0, [marker, sleep_s], {}, timeout_s=2.0)
        else:
            assert worker.call(0, [marker, sleep_s], {}, timeout_s=30.0) == [1.0]
            assert marked(marker), "the sleep never started"
            worker.close()
        assert wait_gone(marked(marker), timeout=30) == []
    finally:
        worker.close()
        kill_marked(marker)


TRAINER = """
import time
from tests.unit.rewards.test_reward_worker_processes import spawn_in_new_session
from gspo_cli.rewards.worker import RewardWorker, WorkerFunction

RewardWorker([WorkerFunction(spawn_in_new_session, None)]).call(0, [{marker!r}, 600], {{}}, 600)
"""


def test_what_a_reward_started_in_its_own_session_ends_when_the_trainer_is_sigkilled() -> None:
    argv = [sys.executable, "-c", TRAINER.format(marker="987673")]
    assert survivors_of_sigkill(argv, "987673", REPO, timeout=120) == []
