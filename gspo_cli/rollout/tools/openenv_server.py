"""An OpenEnv environment's server (openenv-core, `rollout.tools.openenv`): started by gspo from
a local module, or reached at a URL; and the one tool it offers the model, made from its action.

OpenEnv serves an environment over HTTP and a WebSocket (`create_app(EnvClass, ActionClass,
ObservationClass)` in a module, run by uvicorn). A target `module:app` is started here as a
process of its own (uvicorn on a socket gspo binds and hands over, so no port is raced for),
waited for on `/health`, and ended with the run; a SIGKILLed trainer takes it along
(`die_with_parent_argv`). A target `http://host:port` is a server someone else runs.

The action's JSON schema (`/schema`) becomes the tool `step`: its fields are the arguments
(`metadata`, OpenEnv's own, is left out). A local module's schema is read in this process from
the app itself (starlette's TestClient: no server needed at validate time); a URL's from the
server, under a deadline.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from gspo_cli.core.errors import GspoError
from gspo_cli.core.workers import die_with_parent_argv
from gspo_cli.rollout.tools.functions import import_object

OPENENV = "rollout.tools.openenv"
EXTRA = "pip install 'gspo-cli[environments]'"
STEP_TOOL = "step"  # the one tool an OpenEnv environment offers: its action
START_TIMEOUT_S = 120.0  # a local server must answer /health within this
REQUEST_TIMEOUT_S = 30.0  # /schema and /health of a server at a URL
LOG_LINES = 20  # a server's last lines, kept to say why it ended


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://", "ws://", "wss://"))


def require_openenv() -> None:
    """GspoError naming the extra when openenv-core is not installed."""
    try:
        importlib.import_module("openenv.core")
    except ImportError:
        raise GspoError(f"{OPENENV} needs openenv-core: {EXTRA}") from None


def _app(target: str) -> Any:
    """The ASGI app `module:app` names, imported as users' tools are (a child first)."""
    if ":" not in target:
        raise GspoError(f"{OPENENV}: {target!r} is not module:app nor an http:// URL")
    app = import_object(target, OPENENV)
    if not callable(app):
        raise GspoError(f"{OPENENV}: {target!r} is not an ASGI app")
    return app


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read().decode("utf-8"))


@functools.cache
def action_schema(target: str) -> dict[str, Any]:
    """The JSON schema of the environment's action (OpenEnv's `/schema`), read once."""
    require_openenv()
    if is_url(target):
        url = http_url(target) + "/schema"
        try:
            schemas = _get_json(url, REQUEST_TIMEOUT_S)
        except (OSError, ValueError) as exc:  # refused, timed out, not JSON
            raise GspoError(
                f"{OPENENV}: {target}: no OpenEnv server answers {url} ({exc})"
            ) from None
    else:
        from starlette.testclient import TestClient

        try:
            schemas = TestClient(_app(target)).get("/schema").json()
        except GspoError:
            raise
        except Exception as exc:  # not an OpenEnv app: no /schema, or not JSON
            raise GspoError(
                f"{OPENENV}: {target!r}: not an OpenEnv app (GET /schema: {exc}); make it with "
                "openenv's create_app(Environment, Action, Observation)"
            ) from None
    action = schemas.get("action") if isinstance(schemas, dict) else None
    if not isinstance(action, dict) or not isinstance(action.get("properties"), dict):
        raise GspoError(f"{OPENENV}: {target}: /schema has no action schema with properties")
    return action


def _plain(schema: Any) -> Any:
    """A JSON schema without pydantic's `title`s (noise in a prompt)."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def step_tool_schema(target: str) -> dict[str, Any]:
    """The tool the chat template shows: `step`, with the action's fields as its arguments."""
    action = action_schema(target)
    properties = {k: v for k, v in action["properties"].items() if k != "metadata"}
    parameters: dict[str, Any] = {"type": "object", "properties": _plain(properties)}
    required = [name for name in action.get("required", []) if name in properties]
    if required:
        parameters["required"] = required
    if "$defs" in action:  # nested models the properties refer to
        parameters["$defs"] = _plain(action["$defs"])
    about = action.get("description") or f"Act in the environment ({action.get('title', '')})"
    return {
        "type": "function",
        "function": {"name": STEP_TOOL, "description": about, "parameters": parameters},
    }


def http_url(target: str) -> str:
    """`target` as an http(s) base URL without a trailing slash."""
    url = target.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            url = http + url[len(ws) :]
    return url


class OpenEnvServer:
    """The server of one target: started here (`module:app`) or reached (a URL)."""

    def __init__(self, target: str) -> None:
        require_openenv()
        self.target = target
        self.process: subprocess.Popen[bytes] | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        if is_url(target):
            self.url = http_url(target)
            self._wait_healthy(REQUEST_TIMEOUT_S)
        else:
            _app(target)  # a bad module is one line here rather than a dead server later
            self.url = self._start()

    def _start(self) -> str:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port = listener.getsockname()[1]
        command = [sys.executable, "-m", "uvicorn", self.target, "--fd", str(listener.fileno())]
        command += ["--log-level", "warning"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or "." for p in sys.path)}
        try:
            self.process = subprocess.Popen(
                [*die_with_parent_argv(), *command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(listener.fileno(),),
                start_new_session=True,  # its group ends with it (close)
                env=env,
            )
        finally:
            listener.close()  # the server holds its own copy
        threading.Thread(target=self._keep_log, daemon=True).start()
        self.url = f"http://127.0.0.1:{port}"
        self._wait_healthy(START_TIMEOUT_S)
        return self.url

    def _keep_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line.decode("utf-8", "replace").rstrip())

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        problem = "no answer"
        while time.monotonic() < deadline:
            self.raise_if_gone()
            try:
                _get_json(self.url + "/health", min(5.0, REQUEST_TIMEOUT_S))
                return
            except (OSError, ValueError) as exc:
                problem = str(exc)
            time.sleep(0.1)
        self.close()
        raise GspoError(
            f"{OPENENV}: {self.target}: the server did not answer /health within {timeout_s:g} s "
            f"({problem})"
        )

    def healthy(self) -> bool:
        """Whether the server answers /health now (a short deadline)."""
        if self.process is not None and self.process.poll() is not None:
            return False
        try:
            _get_json(self.url + "/health", 5.0)
        except (OSError, ValueError):
            return False
        return True

    def raise_if_gone(self, wait_s: float = 0.0) -> None:
        """GspoError when a server started here has exited (with its last log line); with
        `wait_s`, a server whose connection just broke is given that long to finish exiting."""
        if self.process is None:
            return
        if wait_s:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait_s)
        if self.process.poll() is None:
            return
        last = next((line for line in reversed(self.log) if line.strip()), "no output")
        raise GspoError(
            f"{OPENENV}: {self.target}: the environment server exited with code "
            f"{self.process.returncode} ({last})"
        )

    def close(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


_servers: dict[str, OpenEnvServer] = {}
_servers_lock = threading.Lock()


def server_for(target: str) -> OpenEnvServer:
    """The process's one server for `target`, started at its first use and ended at exit."""
    with _servers_lock:
        server = _servers.get(target)
        if server is None:
            server = _servers[target] = OpenEnvServer(target)
            atexit.register(server.close)
        return server
