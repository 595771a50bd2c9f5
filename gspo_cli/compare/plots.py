"""PNG plots, one per metric, one line per run, drawn headless with matplotlib's Agg canvas.

Every image is FIGSIZE inches at DPI: 8 x 4.5 in at 100 dpi = 800 x 450 px. With --smooth W > 1
the smoothed curve is drawn solid over the raw one (faint); held-out accuracy (sparse evals) is
never smoothed. NaN/inf points are left as gaps, and the step where a verdict fired is marked
with a dotted vertical line in the run's colour. A plot whose metric no run has is skipped.

With --group-seeds each seed group is one line, the mean over its seeds at the steps they all
logged (seeds.group_band; each seed smoothed first), with the 95% t interval shaded around it;
every seed's verdict steps are marked in the group's colour.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from gspo_cli.compare.seeds import group_band
from gspo_cli.compare.series import (
    HELDOUT,
    RATIO_SPREAD,
    X_LABELS,
    Series,
    is_heldout,
    metric_series,
    smooth,
    x_positions,
)
from gspo_cli.compare.stats import Comparison, RunReport, SeedGroup
from gspo_cli.runs.folder import write_bytes_atomic

FIGSIZE = (8.0, 4.5)
DPI = 100
# (title, y label) of the default plots, in order; other metrics get their key as title.
PLOTS: dict[str, tuple[str, str]] = {
    "reward_mean": ("Reward (mean per step)", "reward"),
    HELDOUT: ("Held-out accuracy", "accuracy"),
    "heldout_answered": ("Held-out answers in the expected form", "share answered"),
    "heldout_accuracy_any_form": ("Held-out accuracy, answer in any form", "accuracy"),
    "heldout_ran_clean": ("Held-out programs that ran clean", "share ran clean"),
    "clip_frac": ("Clip fraction", "share of tokens clipped"),
    RATIO_SPREAD: ("Sequence-ratio spread (max - min per step)", "seq_ratio_max - seq_ratio_min"),
    "entropy": ("Policy entropy", "entropy (nats/token)"),
    "grad_norm": ("Gradient norm", "grad norm (before clipping)"),
    "response_len_mean": ("Mean response length", "tokens"),
    "expert_volatility": ("MoE expert-routing volatility", "share of routed experts changed"),
    "mismatch_token_abs_mean": ("Rollout engine vs trainer", "mean |delta log p| per token"),
    "tool_calls_per_response": ("Tool calls per response", "calls"),
    "judge_train/mean": ("Training judge on held-out prompts", "judge score"),
    "judge_heldout/mean": ("Held-out judge on held-out prompts", "judge score"),
}
# Which verdicts are marked on which plot.
MARKS = {
    "reward_mean": ("non_finite", "reward_collapse"),
    "grad_norm": ("non_finite",),
    "entropy": ("entropy_collapse",),
}
MARK_LABELS = {"non_finite": "NaN/inf", "reward_collapse": "collapse", "entropy_collapse": "H"}


def _title(key: str) -> tuple[str, str]:
    """(title, y label) of a plot outside PLOTS: an environment's held-out accuracy, or the
    metric's own key."""
    if key.startswith("heldout_env/"):
        return f"Held-out accuracy: environment {key.split('/')[1]}", "accuracy"
    if key.startswith("heldout_curve/"):  # gspo eval RUN --steps
        _, benchmark, metric = key.split("/", 2)
        return f"{benchmark} {metric} at the run's checkpoints", metric
    return key, key


def plot_keys(cmp: Comparison) -> list[str]:
    """The metrics to plot: --metrics when given (without "eval"), else the default set and
    each reward function's curve."""
    if cmp.metrics is None:
        return [*PLOTS, *cmp.environment_keys, *cmp.reward_keys]
    return [m for m in cmp.metrics if m != "eval"]


def _curves(report: RunReport, key: str, cmp: Comparison) -> list[tuple[Any, Any, bool]]:
    """(x, y, is_raw) lines of one run; empty when it lacks the metric or the x axis."""
    series = metric_series(report.run, key)
    if series is None:
        return []
    xs = x_positions(report.run, cmp.x, series.steps)
    if xs is None:
        return []
    clean = Series(series.steps, np.where(np.isfinite(series.values), series.values, np.nan))
    if cmp.smooth <= 1 or is_heldout(key):
        return [(xs, clean.values, False)]
    return [(xs, clean.values, True), (xs, smooth(clean, cmp.smooth).values, False)]


def _mark(ax: Any, report: RunReport, key: str, cmp: Comparison, color: Any) -> None:
    for issue in report.issues:
        if issue.kind not in MARKS.get(key, ()):
            continue
        xs = x_positions(report.run, cmp.x, np.array([issue.step]))
        if xs is None:
            continue
        ax.axvline(float(xs[0]), color=color, linestyle=":", linewidth=1.2)
        ax.annotate(
            MARK_LABELS[issue.kind],
            (float(xs[0]), 1.0),
            xycoords=("data", "axes fraction"),
            color=color,
            fontsize=8,
            ha="left",
            va="top",
        )


def _save_atomic(fig: Any, path: Path) -> None:
    """Render in memory, then replace `path` atomically: readers never see half a PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    write_bytes_atomic(path, buffer.getvalue())


def _draw_groups(ax: Any, groups: list[SeedGroup], key: str, cmp: Comparison) -> bool:
    """One mean line and shaded 95% band per seed group; False when no group has `key`."""
    drawn = False
    for index, group in enumerate(groups):
        color = f"C{index % 10}"
        band = group_band(group, key, cmp.x, cmp.smooth)
        if band is None:
            continue
        n = len(group.reports)
        some = "" if band.seeds == n else f", {band.seeds} of {n} seeds have it"
        label = f"{group.label} ({group.view.stats['algorithm']}{some})"
        marker = "o" if len(band.xs) < 30 else None
        ax.plot(band.xs, band.mean, color=color, label=label, marker=marker, markersize=3)
        ax.fill_between(band.xs, band.low, band.high, color=color, alpha=0.2, linewidth=0)
        for report in group.reports:
            _mark(ax, report, key, cmp, color)
        drawn = True
    return drawn


def draw(cmp: Comparison, key: str, path: Path) -> bool:
    """Write the plot of `key` to `path`; False (nothing written) when no run has it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)  # Agg: headless, no display, no global pyplot state
    ax = fig.add_subplot()
    drawn = cmp.groups is not None and _draw_groups(ax, cmp.groups, key, cmp)
    for index, report in enumerate(cmp.reports if cmp.groups is None else []):
        color = f"C{index % 10}"
        for xs, ys, raw in _curves(report, key, cmp):
            label = None if raw else f"{report.run.name} ({report.stats['algorithm']})"
            marker = "o" if len(xs) < 30 else None
            ax.plot(
                xs,
                ys,
                color=color,
                alpha=0.25 if raw else 1.0,
                label=label,
                marker=marker,
                markersize=3,
            )
            drawn = True
        _mark(ax, report, key, cmp, color)
    if not drawn:
        return False
    title, ylabel = PLOTS.get(key, _title(key))
    suffix = (
        f" (trailing mean over {cmp.smooth} steps)" if cmp.smooth > 1 and key != HELDOUT else ""
    )
    suffix += "\nmean over seeds, 95% t interval shaded" if cmp.groups is not None else ""
    ax.set_title(title + suffix)
    ax.set_xlabel(X_LABELS[cmp.x])
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()  # keeps the figure size: no bbox_inches="tight"
    _save_atomic(fig, path)
    return True


def write_plots(cmp: Comparison, out_dir: Path) -> list[Path]:
    """Every plot some run has data for, as `<metric>.png` in `out_dir`."""
    written = []
    for key in plot_keys(cmp):
        path = out_dir / f"{safe_name(key)}.png"
        if draw(cmp, key, path):
            written.append(path)
    return written


def safe_name(key: str) -> str:
    """A file name for a metric key (keys are identifiers, but --metrics is user input)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key).strip(".") or "metric"
