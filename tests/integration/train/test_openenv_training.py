"""A run with an OpenEnv environment beside the arithmetic task (`environments[].id:
openenv:module:app`, `data.chat_template: hermes` on the tiny ChatML model): gspo starts the
server, every trajectory of the environment has its session, its metrics come under its name,
and no server outlives the run. A server that dies mid-run stops the run in one line (exit 2),
and `--resume` goes on from the last checkpoint once the server is healthy again (two runs: the
server's imports cost seconds in the trainer and in the server each)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.helpers import run_cli, run_metrics, write_recipe

pytest.importorskip("openenv.core", reason="the environments extra (make setup installs it)")
pytestmark = pytest.mark.slow

MODULE = "gspo_test_openenv_run"
SOURCE = '''
"""Guess a number from 1 to 9; the server ends itself at a reset once RESETS has as many lines
as the file DIE says."""
import os
import pathlib
import random

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

DIE = pathlib.Path({die!r})
RESETS = pathlib.Path({resets!r})


class GuessAction(Action):
    """Guess the hidden number."""

    number: int = Field(..., description="your guess, 1 to 9")


class GuessObservation(Observation):
    feedback: str = ""


class Guess(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self.secret = 0

    def reset(self, seed=None, episode_id=None):
        done = len(RESETS.read_text().split()) if RESETS.exists() else 0
        if DIE.exists() and done >= int(DIE.read_text()):
            os._exit(3)
        with RESETS.open("a") as log:
            log.write(f"{{seed}}\\n")
        self.secret = random.Random(seed).randint(1, 9)
        return GuessObservation(feedback="guess")

    def step(self, action):
        hit = action.number == self.secret
        return GuessObservation(feedback="correct" if hit else "no", done=hit, reward=float(hit))

    @property
    def state(self):
        return State(episode_id="", step_count=0)


app = create_app(Guess, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
'''


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory, sft_checkpoint: Path) -> Path:
    folder = tmp_path_factory.mktemp("openenv-run")
    (folder / f"{MODULE}.py").write_text(
        textwrap.dedent(SOURCE).format(die=str(folder / "die"), resets=str(folder / "resets"))
    )
    rows = [{"prompt": f"Game {i}: find the number.", "answer": "", "seed": i} for i in range(40)]
    (folder / "guess.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    guess = {
        "name": "guess",
        "id": f"openenv:{MODULE}:app",
        "data": {"source": str(folder / "guess.jsonl"), "heldout_size": 4},
        "tools": {"max_calls": 2, "output_max_tokens": 8},
        "max_new_tokens": 40,
        "eval": {"num_problems": 4, "samples": 1},
        "cold_start": False,
    }
    return write_recipe(
        folder,
        {
            "model": {"path": str(sft_checkpoint)},
            "data": {"chat_template": "hermes", "max_prompt_tokens": 1024},
            "environments": [{"name": "sums", "weight": 1}, {**guess, "weight": 1}],
            "trainer": {"steps": 2, "checkpoint_every": 1, "out_dir": str(folder / "runs")},
            "eval": {"every": 2},
        },
    )


def _servers() -> list[str]:
    found = subprocess.run(["pgrep", "-af", MODULE], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "uvicorn" in line]


def test_an_openenv_environment_trains_beside_a_task_and_resumes_after_its_server_died(
    recipe: Path,
) -> None:
    env = {"PYTHONPATH": str(recipe.parent)}
    out = recipe.parent / "run"
    per_step = 2 * 4  # the environment's prompts per step x group size
    held_out = 4  # its held-out prompts, one sample each, evaluated before step 1
    (recipe.parent / "die").write_text(str(held_out + per_step))  # the server dies in step 2
    died = run_cli("train", str(recipe), "--out", str(out), env=env)
    assert died.returncode == 2, died.stderr[-3000:]
    line = died.stderr.strip().splitlines()[-1]
    assert "rollout.tools.openenv" in line and "exited with code 3" in line, died.stderr[-2000:]
    assert "Traceback" not in died.stderr and _servers() == []
    assert sorted(run_metrics(out)) == [1]
    # each trajectory reset its own session with its row's seed: a group shares one game
    resets = (recipe.parent / "resets").read_text().split()
    assert len(resets) == held_out + per_step and len(set(resets[held_out:])) == 2, resets

    (recipe.parent / "die").unlink()
    resumed = run_cli("train", str(recipe), "--out", str(out), "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = run_metrics(out)
    assert sorted(metrics) == [1, 2]
    for step in metrics.values():
        assert step["env/guess/batch_share"] == 0.5
        assert "env/guess/reward/environment/mean" in step
        assert "env/guess/tool_calls_per_response" in step
    evaluated = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evaluated] == [0, 2]
    assert all("env/guess/accuracy" in record for record in evaluated)
    assert _servers() == []  # the server ended with the run
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(isinstance(r["tool_calls"], int) for r in samples)  # gspo watch shows
