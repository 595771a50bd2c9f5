"""One trajectory's session with an OpenEnv environment (`rollout.tools.openenv`): the toolbox
whose one tool, `step`, is the environment's action.

The session is a WebSocket of openenv-core's own client (`GenericEnvClient`), which gives each
connection an environment instance of its own on the server. It is opened and reset when the
trajectory starts (its episode starts with it, as in TRL): `reset(**row)` gets the prompt's
dataset row (the server passes on the fields its reset names), so a `seed` column puts a
group's samples in one game.
Every call runs under `rollout.tools.timeout_s` (connect and reply).

- a step's observation (less `done`, `reward`, `metadata`) is what the model is shown, as JSON;
- the trajectory's reward is the sum of the steps' rewards (the episode's return);
- after `done` the episode is over: later calls are answered so, not sent;
- arguments that do not fit the action's schema are answered with why, not sent;
- a step past the deadline is answered as a timeout and ends the session (its reply would
  arrive out of turn): later calls are refused, and the trajectory has no reward;
- a server that is gone (refused, closed, exited) stops the run with one line: the run folder
  resumes from its last checkpoint once the server is back.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gspo_cli.core.errors import GspoError
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.base import (
    MAX_CHARS_PER_TOKEN,
    ToolCall,
    ToolResult,
    cap_text,
    cut_output,
    result_text,
)
from gspo_cli.rollout.tools.functions import first_line
from gspo_cli.rollout.tools.openenv_server import (
    OPENENV,
    STEP_TOOL,
    OpenEnvServer,
    action_schema,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SERVER_ERROR = "Server error: "  # how openenv's client words an error the server answered
GONE_WAIT_S = 3.0  # how long a server whose socket broke is given to finish exiting
CAPACITY = "CAPACITY_REACHED"  # the server's code for "no session left" (max_concurrent_envs)
OBSERVATION_BOOKKEEPING = ("done", "reward", "metadata")  # an observation's fields not shown


def _json_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row's fields that JSON can carry (reset's keyword arguments go over the wire)."""
    kept = {}
    for key, value in row.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        kept[str(key)] = value
    return kept


def _argument_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the action's schema (jsonschema's most telling error), or
    None."""
    import jsonschema
    from jsonschema.exceptions import best_match

    validator = jsonschema.validators.validator_for(schema)(schema)
    error = best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


class OpenEnvToolbox:
    """The calls of one trajectory, sent to its own session on the environment's server."""

    def __init__(
        self,
        settings: ToolSettings,
        tokenizer: PreTrainedTokenizerBase,
        server: OpenEnvServer,
        row: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.server = server
        self.schema = action_schema(server.target)
        self.row = _json_fields(row or {})
        self.client: Any = None  # openenv's SyncEnvClient
        self.rewards: list[float] = []  # each step's reward, in order
        self.done = False
        self.broken: str | None = None  # why every later call is refused
        self._open()

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        return [self._run_one(call) for call in calls]

    def _run_one(self, call: ToolCall) -> ToolResult:
        refusal = self._refusal(call)
        if refusal is not None:
            return ToolResult(refusal, True, 0.0)
        start = time.perf_counter()
        try:
            result = self.client.step(call.arguments)
        except TimeoutError:
            self._close_client()
            text = f"TimeoutError: step ran past {self.settings.timeout_s:g} s"
            self.broken = f"the environment session is over: an earlier step timed out ({text})"
            return ToolResult(text, True, time.perf_counter() - start)
        except RuntimeError as exc:  # the server answered an error (the environment raised)
            if not str(exc).startswith(SERVER_ERROR):
                raise self._gone(exc) from None
            return ToolResult(str(exc)[len(SERVER_ERROR) :], True, time.perf_counter() - start)
        except Exception as exc:  # the connection: refused, closed, reset
            raise self._gone(exc) from None
        seconds = time.perf_counter() - start
        self.rewards.append(self._number(result.reward))
        self.done = bool(result.done)
        observation = result.observation
        if isinstance(observation, dict):
            observation = {k: v for k, v in observation.items() if k not in OBSERVATION_BOOKKEEPING}
        max_chars = self.settings.output_max_tokens * MAX_CHARS_PER_TOKEN
        text, dropped = cap_text(
            result_text(observation), max_chars, self.settings.output_truncation
        )
        shown, cut = cut_output(
            text, self.tokenizer, self.settings.output_max_tokens, self.settings.output_truncation,
            dropped,
        )  # fmt: skip
        return ToolResult(shown, False, seconds, cut)

    def _refusal(self, call: ToolCall) -> str | None:
        """Why `call` is answered without reaching the server, or None."""
        if call.error is not None:
            return call.error
        if self.broken is not None:
            return self.broken
        if call.name != STEP_TOOL:
            return f"unknown tool {call.name!r}; the tools are: {STEP_TOOL}"
        if self.done:
            return "the episode is over (the environment said done); answer now"
        problem = _argument_problem(self.schema, call.arguments)
        return None if problem is None else f"bad arguments for {STEP_TOOL}: {problem}"

    def _open(self) -> None:
        """The trajectory's session, opened and reset."""
        from openenv.core import GenericEnvClient

        timeout = self.settings.timeout_s
        client = GenericEnvClient(
            base_url=self.server.url, connect_timeout_s=timeout, message_timeout_s=timeout
        ).sync()
        try:
            client.connect()
            client.reset(**self.row)
        except TimeoutError:
            client.close()
            raise GspoError(
                f"{OPENENV}: {self.server.target}: reset ran past {timeout:g} s"
            ) from None
        except RuntimeError as exc:
            client.close()
            if not str(exc).startswith(SERVER_ERROR):
                raise self._gone(exc) from None
            if CAPACITY in str(exc):
                raise self._refused(str(exc)) from None
            raise GspoError(f"{OPENENV}: {self.server.target}: reset failed ({exc})") from None
        except Exception as exc:
            client.close()
            if self.server.healthy():  # alive, yet it closed the new session: its capacity
                raise self._refused(f"it closed the session at once: {first_line(exc)}") from None
            raise self._gone(exc) from None
        self.client = client

    def _refused(self, why: str) -> GspoError:
        """A live server that takes no new session: most likely its max_concurrent_envs."""
        return GspoError(
            f"{OPENENV}: {self.server.target}: the server refused a session ({why}); each "
            "trajectory of a generation holds one at once (prompts x samples): raise "
            "max_concurrent_envs in its create_app"
        )

    def _gone(self, exc: BaseException) -> GspoError:
        """The run's end when the server cannot be reached: why, in one line."""
        self._close_client()
        # a server started here that exited says how (its exit can trail the broken socket)
        self.server.raise_if_gone(wait_s=GONE_WAIT_S)
        return GspoError(
            f"{OPENENV}: {self.server.target}: the environment server is unreachable "
            f"({first_line(exc)}); the run folder resumes once it is back"
        )

    def _number(self, reward: Any) -> float:
        value = 0.0 if reward is None else reward
        if isinstance(value, bool | int | float) and math.isfinite(float(value)):
            return float(value)
        raise GspoError(
            f"{OPENENV}: {self.server.target}: a step's reward is {value!r}; it must be a "
            "finite number or null"
        )

    def reward(self) -> float | None:
        """The episode's return (the sum of its steps' rewards; 0 without a step), or None
        when a timeout ended the session."""
        return None if self.broken is not None else math.fsum(self.rewards)

    def _close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def close(self) -> None:
        self._close_client()
