"""OpenEnv environments (rollout.tools.openenv): a local module's server started and ended by
gspo, its action offered as the tool `step`, one session per trajectory reset with the row,
token in / token out kept, the episode's return as the reward; bad arguments, a finished
episode, a hung step and a dead server each answered or stopped in one line. Waits are
bounded, not timed."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="the environments extra (make setup installs it)")

from gspo_cli.core.errors import GspoError
from gspo_cli.data.chat_templates import HERMES_TOOL_TEMPLATE
from gspo_cli.models.tokenizer import build_char_tokenizer
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import ToolCall
from gspo_cli.rollout.tools.openenv_server import (
    OpenEnvServer,
    server_for,
    step_tool_schema,
)
from gspo_cli.rollout.tools.openenv_session import OpenEnvToolbox

MODULE = "gspo_test_guess_env"
TARGET = f"{MODULE}:app"
SOURCE = '''
"""Guess a number from 1 to 9, drawn by reset's seed; each wrong guess says higher or lower."""
import random
import time

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """Guess the hidden number."""

    number: int = Field(..., description="your guess, 1 to 9")
    wait_s: float = Field(0.0, description="seconds to think first")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="higher, lower or correct")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state = State(episode_id="", step_count=0)
        self.secret = 0

    def reset(self, seed=None, episode_id=None, crash=False):
        if crash:
            raise ValueError("reset was told to fail")
        self.secret = random.Random(seed).randint(1, 9)
        return GuessObservation(feedback="guess", done=False, reward=0.0)

    def step(self, action):
        time.sleep(action.wait_s)
        self._state.step_count += 1
        if action.number == self.secret:
            return GuessObservation(feedback="correct", done=True, reward=1.0)
        word = "higher" if action.number < self.secret else "lower"
        return GuessObservation(feedback=word, done=False, reward=-0.25)

    @property
    def state(self):
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                 max_concurrent_envs=6)
'''


def secret(seed: int) -> int:
    import random

    return random.Random(seed).randint(1, 9)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenEnvServer]:
    folder = tmp_path_factory.mktemp("openenv")
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    sys.path.insert(0, str(folder))
    try:
        started = server_for(TARGET)
        yield started
    finally:
        started.close()
        sys.path.remove(str(folder))


def toolbox(server: OpenEnvServer, row: dict[str, object], **settings: object) -> OpenEnvToolbox:
    tools = ToolSettings(
        format="chat_template",
        interpreter=None,
        openenv=TARGET,
        **settings,  # type: ignore[arg-type]
    )
    return OpenEnvToolbox(tools, build_char_tokenizer(), server, row)


def step(number: int, **more: object) -> ToolCall:
    return ToolCall("step", {"number": number, **more})


def test_the_action_is_the_tool_step_with_its_fields(server: OpenEnvServer) -> None:
    schema = step_tool_schema(TARGET)["function"]
    assert schema["name"] == "step" and schema["description"] == "Guess the hidden number."
    parameters = schema["parameters"]
    assert set(parameters["properties"]) == {"number", "wait_s"}  # not openenv's metadata
    assert parameters["required"] == ["number"]
    assert parameters["properties"]["number"] == {
        "description": "your guess, 1 to 9",
        "type": "integer",
    }


def test_a_session_plays_its_rows_game_and_returns_the_episodes_return(
    server: OpenEnvServer,
) -> None:
    box = toolbox(server, {"prompt": "play", "seed": 7, "answer": object()})  # not JSON: left
    hidden = secret(7)
    wrong = 1 if hidden != 1 else 2
    try:
        first, second = box.run([step(wrong), step(hidden)])
        assert first.text == '{"feedback": "higher"}' and not first.error
        assert second.text == '{"feedback": "correct"}'
        (after,) = box.run([step(hidden)])  # the episode is over: answered, not sent
        assert after.error and "episode is over" in after.text
        assert box.reward() == pytest.approx(0.75)  # -0.25 + 1.0, the sum of the steps
    finally:
        box.close()


def test_bad_calls_are_answered_and_never_sent(server: OpenEnvServer) -> None:
    box = toolbox(server, {"seed": 3})
    try:
        results = box.run(
            [
                ToolCall("step", {"number": "five"}),
                ToolCall("step", {"guess": 5}),
                ToolCall("move", {"number": 5}),
            ]
        )
        assert [r.error for r in results] == [True, True, True]
        assert "number: 'five' is not of type 'integer'" in results[0].text
        assert "'guess' was unexpected" in results[1].text
        assert results[2].text == "unknown tool 'move'; the tools are: step"
        assert box.client is not None and box.rewards == []  # no step reached the server
        assert box.reward() == 0.0  # no step: the return is 0
    finally:
        box.close()


def test_a_hung_step_is_a_timeout_and_ends_the_session(server: OpenEnvServer) -> None:
    box = toolbox(server, {"seed": 3}, timeout_s=0.5)
    try:
        (late,) = box.run([step(5, wait_s=3.0)])
        assert late.error and late.text == "TimeoutError: step ran past 0.5 s"
        (refused,) = box.run([step(secret(3))])
        assert refused.error and "an earlier step timed out" in refused.text
        assert box.reward() is None  # no return for a cut episode
    finally:
        box.close()


def test_a_reset_that_fails_stops_the_run_in_one_line(server: OpenEnvServer) -> None:
    with pytest.raises(GspoError, match=r"reset failed .*reset was told to fail"):
        toolbox(server, {"crash": True})


def test_the_group_shares_one_game_and_the_engines_ids(server: OpenEnvServer) -> None:
    from gspo_cli.rollout.tools.build import make_tool_parts
    from gspo_cli.rollout.tools.trajectory import ToolUseEngine

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = HERMES_TOOL_TEMPLATE
    tools = ToolSettings(format="chat_template", interpreter=None, openenv=TARGET)
    fmt, make_toolbox = make_tool_parts(tools, tokenizer, "tiny")
    hidden = secret(11)
    arguments = json.dumps({"name": "step", "arguments": {"number": hidden}})
    call = f"<tool_call>\n{arguments}\n</tool_call><|im_end|>"
    done = "\\boxed{found}<|im_end|>"

    class Player:
        def generate(self, prompts, params, seeds=None, **_):  # type: ignore[no-untyped-def]
            texts = [done if "<tool_response>" in tokenizer.decode(p) else call for p in prompts]
            completions = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
            return RolloutBatch(prompts, completions, None, texts, [False] * len(prompts))

        def sync_weights(self) -> None: ...

        def close(self) -> None: ...

    engine = ToolUseEngine(Player(), tokenizer, tools, fmt, make_toolbox)  # type: ignore[arg-type]
    prompt = list(
        tokenizer("<|im_start|>user\nplay<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    )
    out = engine.generate(
        [prompt], SamplingParams(max_new_tokens=300, num_samples=3), rows=[{"seed": 11}]
    )
    assert out.tool_traces is not None and out.from_tool is not None
    assert [t.environment_reward for t in out.tool_traces] == [1.0, 1.0, 1.0]  # one game each
    for ids, from_tool in zip(out.completion_ids, out.from_tool, strict=True):
        model = [t for t, f in zip(ids, from_tool, strict=True) if not f]
        tool = [t for t, f in zip(ids, from_tool, strict=True) if f]
        assert model == list(tokenizer(call + done, add_special_tokens=False)["input_ids"])
        assert '<tool_response>\n{"feedback": "correct"}\n</tool_response>' in tokenizer.decode(
            tool
        )


def test_a_dead_server_stops_the_run_in_one_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "gspo_test_guess_env_2.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    doomed = OpenEnvServer("gspo_test_guess_env_2:app")
    try:
        box = toolbox(doomed, {"seed": 1})  # a live session
        assert doomed.process is not None
        os.killpg(doomed.process.pid, signal.SIGKILL)
        doomed.process.wait(timeout=60)
        with pytest.raises(GspoError, match=r"environment server exited with code -9"):
            box.run([step(6)])
        with pytest.raises(GspoError, match="exited with code -9"):
            toolbox(doomed, {"seed": 1})
    finally:
        doomed.close()


def test_targets_that_cannot_work_are_one_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gspo_cli.rollout.tools.openenv_server import action_schema

    (tmp_path / "gspo_test_not_openenv.py").write_text("def app(scope, receive, send):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GspoError, match=r"'gspo_test_nowhere:app': cannot import"):
        action_schema("gspo_test_nowhere:app")
    with pytest.raises(GspoError, match="not an OpenEnv app"):
        action_schema("gspo_test_not_openenv:app")
    with pytest.raises(GspoError, match="no OpenEnv server answers"):
        action_schema("http://127.0.0.1:9")  # the discard port: refused


def test_an_environment_id_is_its_server_tool_and_reward(server: OpenEnvServer) -> None:
    from gspo_cli.recipe.loader import validate_recipe

    guess = {
        "name": "guess",
        "id": f"openenv:{TARGET}",
        "tools": {"max_calls": 6},
        "max_new_tokens": 200,
    }
    recipe = validate_recipe(
        {"environments": [{"name": "sums", "data": {"source": "builtin:arithmetic"}}, guess]},
        "r.yaml",
    )
    sums, game = recipe.environments_resolved()
    assert sums.recipe.tool_settings() is None
    tools = game.recipe.tool_settings()
    assert tools is not None and (tools.openenv, tools.format, tools.interpreter) == (
        TARGET,
        "chat_template",
        None,
    )
    assert tools.max_calls == 6  # its own tools keys stay
    assert [f.name for f in game.recipe.reward.functions] == ["environment"]


def test_without_the_extra_the_line_names_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gspo_cli.rollout.tools.openenv_server import action_schema

    monkeypatch.setitem(sys.modules, "openenv.core", None)  # import openenv.core: ImportError
    with pytest.raises(
        GspoError, match=r"needs openenv-core: pip install 'gspo-cli\[environments\]'"
    ):
        action_schema("http://127.0.0.1:9/no-extra")


def test_a_server_out_of_sessions_is_one_line_naming_its_setting(server: OpenEnvServer) -> None:
    boxes = [toolbox(server, {"seed": i}) for i in range(6)]  # max_concurrent_envs 6
    try:
        with pytest.raises(GspoError, match=r"refused a session .* raise max_concurrent_envs"):
            toolbox(server, {"seed": 6})
    finally:
        for box in boxes:
            box.close()
