"""`gspo watch`'s screen: a run folder's snapshot (runs/watch.py) as rich renderables.

Top to bottom: where the run is (step, ETA, whether a writer is alive), the last steps' metrics
as sparklines with their last value, held-out accuracy with its interval (per environment too),
the guard (its setting and its last events), and the last step's samples with their rewards
and tool calls.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gspo_cli.runs.watch import RunSnapshot, read_snapshot

BARS = "▁▂▃▄▅▆▇█"
SPARK_STEPS = 40  # steps a sparkline shows
# The curves shown, when the run logs them: (metric, label)
CURVES = (
    ("reward_mean", "reward"),
    ("accuracy", "train accuracy"),
    ("loss", "loss"),
    ("clip_frac", "clip fraction"),
    ("entropy_mean", "entropy"),
    ("response_len_mean", "response length"),
    ("tool_calls_per_response", "tool calls / response"),
    ("grad_norm", "grad norm"),
    ("tokens_per_s", "tokens / s"),
)
SAMPLES_SHOWN = 4
SAMPLE_CHARS = 160


def sparkline(values: list[float]) -> str:
    """The last SPARK_STEPS values as bars scaled to their own min..max."""
    shown = values[-SPARK_STEPS:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    if high == low:
        return BARS[0] * len(shown)
    top = len(BARS) - 1
    return "".join(BARS[round((v - low) / (high - low) * top)] for v in shown)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _header(snap: RunSnapshot) -> Text:
    of = f"/{snap.total_steps}" if snap.total_steps is not None else ""
    line = Text(f"{snap.folder}  step {snap.step}{of}")
    eta = snap.eta_s()
    if snap.writer is not None:
        line.append("  running", style="green")
        line.append(f" (pid {snap.writer.get('pid')})")
        if eta is not None:
            line.append(f"  eta {_duration(eta)}")
    else:
        line.append("  not running", style="yellow")
    if snap.latest_checkpoint:
        line.append(f"  latest checkpoint {snap.latest_checkpoint}")
    return line


def _curves(snap: RunSnapshot) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    for key, label in CURVES:
        values = snap.series(key)
        if values:
            table.add_row(label, sparkline(values), f"{values[-1]:.4g}")
    return table


def _heldout(snap: RunSnapshot) -> Text:
    if not snap.heldout:
        return Text("held-out: not measured yet")
    last = snap.heldout[-1]
    text = Text(f"held-out at step {last.get('step')}: ")
    text.append(_accuracy(last, ""), style="bold")
    names = sorted(
        {k.split("/")[1] for k in last if k.startswith("env/") and k.endswith("/accuracy")}
    )
    for name in names:
        text.append(f"   {name} {_accuracy(last, f'env/{name}/')}")
    first = snap.heldout[0]
    if len(snap.heldout) > 1 and isinstance(first.get("accuracy"), int | float):
        text.append(f"   (step {first.get('step')}: {100 * float(first['accuracy']):.1f}%)")
    return text


def _accuracy(record: dict[str, Any], prefix: str) -> str:
    value = record.get(f"{prefix}accuracy")
    if not isinstance(value, int | float):
        return "?"
    low, high = record.get(f"{prefix}accuracy_ci_low"), record.get(f"{prefix}accuracy_ci_high")
    if isinstance(low, int | float) and isinstance(high, int | float):
        return f"{100 * value:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"
    return f"{100 * value:.1f}%"


def _guard(snap: RunSnapshot) -> Text:
    text = Text(f"guard: on_collapse {snap.on_collapse}")
    trailing = snap.series("bad_updates_trailing")
    if trailing and trailing[-1]:
        text.append(f", {int(trailing[-1])} skipped updates in a row", style="yellow")
    if not snap.events:
        return text.append(", no events")
    for event in snap.events[-3:]:
        text.append(
            f"\n  step {event.get('step')}: {event.get('signal')} -> {event.get('action')} "
            f"({event.get('detail')})",
            style="red" if event.get("action") in ("stop", "rollback") else "yellow",
        )
    return text


def _samples(snap: RunSnapshot) -> Table:
    table = Table(title=f"samples of step {snap.samples[0].get('step')}" if snap.samples else "")
    for column in ("reward", "calls", "prompt", "completion"):
        table.add_column(column, overflow="fold")
    for record in snap.samples[:SAMPLES_SHOWN]:
        reward = record.get("reward")
        table.add_row(
            f"{reward:.3g}" if isinstance(reward, int | float) else str(reward),
            str(record.get("tool_calls", "")),
            _short(record.get("prompt")),
            _short(record.get("completion")),
        )
    return table


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else "" if value is None else str(value)
    text = " ".join(text.split())
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 3] + "..."


def render(snap: RunSnapshot) -> RenderableType:
    """The whole screen for one snapshot."""
    parts: list[RenderableType] = [_header(snap)]
    parts.append(Panel(_curves(snap), title=f"last {SPARK_STEPS} steps") if snap.metrics
                 else Text("no step logged yet"))  # fmt: skip
    parts += [_heldout(snap), _guard(snap)]
    if snap.samples:
        parts.append(_samples(snap))
    return Group(*parts)


def watch_run(folder: Path, console: Console, once: bool = False, interval: float = 2.0) -> None:
    """Show `folder` and refresh it every `interval` seconds while a run writes it; a run that
    is not running (finished, stopped, killed) is shown once. Ctrl-C leaves quietly."""
    snap = read_snapshot(folder)
    if once or snap.writer is None:
        console.print(render(snap))
        return
    try:
        with Live(render(snap), console=console, auto_refresh=False) as live:
            while snap.writer is not None:
                time.sleep(interval)
                snap = read_snapshot(folder)
                live.update(render(snap), refresh=True)
    except KeyboardInterrupt:
        return
