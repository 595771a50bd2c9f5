"""A tracker that fails mid-run is one warning and is off after it; the run goes on."""

from __future__ import annotations

import io

from rich.console import Console

from gspo_cli.train.run.trackers import Tracker


class Flaky(Tracker):
    name = "flaky"

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.logged: list[int] = []

    def _log(self, values: dict[str, float], step: int) -> None:
        if step == 2:
            raise ConnectionError("the server went away\nwith a traceback")
        self.logged.append(step)

    def _close(self) -> None:
        raise AssertionError("a failed tracker is not closed")


def test_a_failing_tracker_warns_once_and_is_off() -> None:
    out = io.StringIO()
    tracker = Flaky(Console(file=out, width=200))
    for step in (1, 2, 3):
        tracker.log({"loss": 1.0, "bad": float("nan"), "text": "x"}, step)
    tracker.close()
    assert tracker.logged == [1]
    text = out.getvalue()
    assert text.count("warning: the flaky tracker failed") == 1
    assert "ConnectionError: the server went away" in text and "traceback" not in text
