"""The comparison table: one row per quantity, one column per run, as rich and as markdown.

Cells of runs other than the baseline carry their difference against it in brackets: reward and
eval values as plain differences, accuracies and clip fractions in percentage points, and
throughput in tokens/s.

With --group-seeds the columns are seed groups (stats.SeedGroup): the same cell functions format
the group's Estimates as `mean ± 95% half-width`; settings rows (`shared`) show the value the
seeds share (or each seed's); the stability row counts the seeds' verdicts. No differences
against a baseline are shown: the intervals are the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from gspo_cli.compare.seeds import stability_text
from gspo_cli.compare.series import JUDGES
from gspo_cli.compare.stats import Comparison, RunReport, SeedGroup
from gspo_cli.compare.verdicts import STABLE, verdict_text

MISSING = "—"
# The held-out answer forms beside accuracy (compare/series.py HELDOUT_FORMS), labelled.
HELDOUT_FORM_ROWS = (
    ("heldout_answered", "held-out answered"),
    ("heldout_accuracy_any_form", "held-out acc any form"),
    ("heldout_ran_clean", "held-out ran clean"),
)
Row = tuple[str, list[str]]
Cell = Callable[[RunReport], str | None]
GroupCell = Callable[[SeedGroup], str | None]


@dataclass(frozen=True)
class RowSpec:
    """A table row: shown when its metric is selected (None: always) and some run has it.

    Seed groups: `group_cell` when given, else `cell` of each seed when `shared` (a setting),
    else `cell` of the group's view (its numbers as Estimates)."""

    label: str
    metric: str | None
    cell: Cell
    delta: str | None = None
    delta_format: str = "{:+.3f}"
    shared: bool = False
    group_cell: GroupCell | None = None


def _get(report: RunReport, *keys: str) -> list[Any] | None:
    values = [report.stats.get(k) for k in keys]
    return None if any(v is None for v in values) else values


def _fmt(fmt: str, *keys: str) -> Cell:
    """A cell that formats stats `keys` with `fmt`, or is missing when one of them is."""

    def cell(report: RunReport) -> str | None:
        values = _get(report, *keys)
        return None if values is None else fmt.format(*values)

    return cell


def _algorithm(report: RunReport) -> str:
    stats = report.stats
    if stats["clip_low"] is None or stats["clip_high"] is None:
        return str(stats["algorithm"])
    return f"{stats['algorithm']} (clip {stats['clip_low']:g}/{stats['clip_high']:g})"


def _routing_replay(report: RunReport) -> str | None:
    """The replay setting of MoE runs (those that measured volatility) or of any run with it on."""
    replay = report.stats["routing_replay"]
    moe = report.stats.get("expert_volatility_mean") is not None
    return replay if moe or replay != "off" else None


def _steps(report: RunReport) -> str:
    done, planned = report.stats["steps_done"], report.stats["steps_planned"]
    if planned is None:
        return f"{done}/?"
    return f"{done}/{planned}" + (" (in progress)" if done < planned else "")


def _clip(report: RunReport) -> str | None:
    mean = report.stats.get("clip_frac_mean")
    if mean is None:
        return None
    sides = _get(report, "clip_frac_low_mean", "clip_frac_high_mean")
    return f"{mean:.2%}" + ("" if sides is None else f" (low {sides[0]:.2%} / high {sides[1]:.2%})")


def _entropy(report: RunReport) -> str | None:
    mean = report.stats.get("entropy_mean")
    if mean is None:
        return None
    ends = _get(report, "entropy_first", "entropy_last")
    return f"{mean:.3f}" + ("" if ends is None else f" ({ends[0]:.3f} → {ends[1]:.3f})")


def _mfu(report: RunReport) -> str | None:
    """Model FLOPs utilisation of each phase (train/step/utilisation.py), either may be missing."""
    values = [report.stats.get(k) for k in ("mfu_rollout_mean", "mfu_train_mean")]
    if all(v is None for v in values):
        return None
    return " / ".join(MISSING if v is None else f"{v:.2%}" for v in values)


def _heldout(report: RunReport) -> str | None:
    values = _get(report, "heldout_first", "heldout_last", "heldout_best", "heldout_best_step")
    if values is None:
        return None
    first, last, best, step = values
    return f"{first:.1%} → {last:.1%} (best {best:.1%} @ {step})"


def _first_last(prefix: str, fmt: str = "{:.1%}") -> Cell:
    """A held-out curve's first → last value (answer forms, judges: few evaluations, no best)."""

    def cell(report: RunReport) -> str | None:
        values = _get(report, f"{prefix}_first", f"{prefix}_last")
        return None if values is None else f"{fmt.format(values[0])} → {fmt.format(values[1])}"

    return cell


def _eval_cell(label: str) -> Cell:
    def cell(report: RunReport) -> str | None:
        entry = report.stats["eval"].get(label)
        if entry is None:
            return None
        low, high = entry["ci_low"], entry["ci_high"]
        interval = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
        return f"{entry['value']:.3f}{interval}"

    return cell


def _axis_point(cmp: Comparison) -> str:
    assert cmp.common_x is not None
    return f"{cmp.common_x:.0f} s" if cmp.x == "time" else f"{cmp.common_x:,.0f}"


def row_specs(cmp: Comparison) -> list[RowSpec]:
    """Every candidate row, in display order: the runs' settings and health, rewards, held-out
    curves and evaluations, training dynamics, then any other --metrics asked for."""
    specs = [
        *_run_rows(),
        *_reward_rows(cmp),
        *_heldout_rows(cmp),
        *_dynamics_rows(),
    ]
    standard = {s.metric for s in specs} | {"clip_frac_low", "clip_frac_high"}
    extra = [m for m in cmp.metrics or [] if m not in standard]
    specs += [RowSpec(f"mean {m}", m, _fmt("{:.4g}", f"{m}_mean")) for m in extra]
    return specs


def _run_rows() -> list[RowSpec]:
    """What each run is and how it went: algorithm, model, seeds, progress, stability."""
    return [
        RowSpec("algorithm", None, _algorithm, shared=True),
        RowSpec("model", None, lambda r: str(r.stats["model"]), shared=True),
        RowSpec("seeds", None, lambda r: None, group_cell=lambda g: ", ".join(map(str, g.seeds))),
        RowSpec("steps done/planned", None, _steps, shared=True),
        RowSpec("stability", None, lambda r: verdict_text(r.issues), group_cell=stability_text),
    ]


def _reward_rows(cmp: Comparison) -> list[RowSpec]:
    """The training reward: final, best, at the common x point, and each reward function's."""
    specs = [
        RowSpec("final reward", "reward_mean", _fmt("{:.3f}", "final_reward"), "final_reward"),
        RowSpec(
            "best reward",
            "reward_mean",
            _fmt("{:.3f} @ step {}", "best_reward", "best_reward_step"),
            "best_reward",
        ),
    ]
    if cmp.common_x is not None:
        label = f"reward @ {cmp.x} {_axis_point(cmp)}"
        cell = _fmt("{:.3f}", "reward_at_common_x")
        specs.append(RowSpec(label, "reward_mean", cell, "reward_at_common_x"))
    for key in cmp.reward_keys:  # each reward function's own curve, as the total's final
        specs.append(RowSpec(f"final {key}", key, _fmt("{:.3f}", f"{key}_final"), f"{key}_final"))
    return specs


def _heldout_rows(cmp: Comparison) -> list[RowSpec]:
    """Held-out accuracy, its answer forms and judges, and the evaluations the runs hold."""
    points = "{:+.1f} pts"
    specs = [
        RowSpec("held-out acc first → last", "heldout_accuracy", _heldout, "heldout_last", points)
    ]
    for key, label in HELDOUT_FORM_ROWS:  # form and substance: docs/evaluation.md
        specs.append(RowSpec(label, key, _first_last(key), f"{key}_last", points))
    for key, prefix in JUDGES:  # judge hacking shows as these two parting ways
        label = f"{prefix.replace('_', ' ')} first → last"
        specs.append(RowSpec(label, key, _first_last(prefix, "{:.3f}"), f"{prefix}_last"))
    for key in cmp.environment_keys:  # a mixture's environments; benchmark curves (--steps)
        _, name, metric = key.split("/", 2)
        label = (
            f"{name} {metric} first → last"
            if key.startswith("heldout_curve/")
            else (f"held-out {name} first → last")
        )
        specs.append(RowSpec(label, key, _first_last(key), f"{key}_last", points))
    labels = dict.fromkeys(label for r in cmp.reports for label in r.stats["eval"])
    specs += [RowSpec(f"eval {lb}", "eval", _eval_cell(lb), f"eval:{lb}") for lb in labels]
    return specs


def _dynamics_rows() -> list[RowSpec]:
    """How training moved: clipping, ratios, entropy, routing, the engines' mismatch, tool
    calls, throughput and MFU."""
    return [
        RowSpec("clip fraction", "clip_frac", _clip, "clip_frac_mean", "{:+.2f} pts"),
        RowSpec("seq-ratio spread", "ratio_spread", _fmt("{:.4g}", "ratio_spread_mean")),
        RowSpec("entropy mean (first → last)", "entropy", _entropy),
        RowSpec("routing replay", None, _routing_replay, shared=True),
        RowSpec(
            "expert volatility / update",
            "expert_volatility",
            _fmt("{:.2%}", "expert_volatility_mean"),
        ),
        RowSpec(
            "engine mismatch |Δ log p|",
            "mismatch_token_abs_mean",
            _fmt("{:.2e}", "mismatch_token_abs_mean_mean"),
        ),
        RowSpec(
            "engine ratio outside clip",
            "mismatch_outside_clip_frac",
            _fmt("{:.1%}", "mismatch_outside_clip_frac_mean"),
        ),
        RowSpec(
            "correction masked tokens",
            "correction_masked_token_frac",
            _fmt("{:.1%}", "correction_masked_token_frac_mean"),
        ),
        RowSpec(
            "tool calls / response",
            "tool_calls_per_response",
            _fmt("{:.2f}", "tool_calls_per_response_mean"),
        ),
        RowSpec("tool calls failed", "tool_error_frac", _fmt("{:.1%}", "tool_error_frac_mean")),
        RowSpec(
            "throughput",
            "tokens_per_s",
            _fmt("{:,.0f} tok/s", "tokens_per_s_mean"),
            "tokens_per_s_mean",
            "{:+,.0f}",
        ),
        RowSpec("MFU rollout / train", "mfu_train", _mfu),
    ]


def _delta_text(spec: RowSpec, report: RunReport, cmp: Comparison) -> str:
    if report is cmp.baseline or spec.delta is None or spec.delta not in report.deltas:
        return ""
    delta = report.deltas[spec.delta]
    if spec.delta_format.endswith("pts"):
        delta *= 100  # fractions shown as percentages: differences in points
    return " (" + spec.delta_format.format(delta) + ")"


def _shared_cell(spec: RowSpec, group: SeedGroup) -> str | None:
    """The seeds' common text, or each seed's (`seed 1: 60/60; seed 2: 45/60 ...`)."""
    texts = [spec.cell(r) for r in group.reports]
    if len(set(texts)) == 1:
        return texts[0]
    return "; ".join(
        f"seed {s}: {MISSING if t is None else t}" for s, t in zip(group.seeds, texts, strict=True)
    )


def group_cells(spec: RowSpec, groups: list[SeedGroup]) -> list[str | None]:
    """One cell per seed group (see RowSpec)."""
    if spec.group_cell is not None:
        return [spec.group_cell(g) for g in groups]
    if spec.shared:
        return [_shared_cell(spec, g) for g in groups]
    return [spec.cell(g.view) for g in groups]


def build_rows(cmp: Comparison) -> list[Row]:
    """(label, cells) of every selected row that at least one run (or seed group) has."""
    rows: list[Row] = []
    for spec in row_specs(cmp):
        if spec.metric is not None and cmp.metrics is not None:
            wanted = set(cmp.metrics)
            if spec.metric == "clip_frac":
                wanted |= {"clip_frac"} if wanted & {"clip_frac_low", "clip_frac_high"} else set()
            if spec.metric not in wanted:
                continue
        if cmp.groups is not None:
            cells = group_cells(spec, cmp.groups)
            if any(c is not None for c in cells):
                rows.append((spec.label, [MISSING if c is None else c for c in cells]))
            continue
        cells = [spec.cell(r) for r in cmp.reports]
        if all(c is None for c in cells):
            continue
        texts = [
            MISSING if c is None else c + _delta_text(spec, r, cmp)
            for c, r in zip(cells, cmp.reports, strict=True)
        ]
        rows.append((spec.label, texts))
    return rows


def headers(cmp: Comparison) -> list[str]:
    if cmp.groups is not None:
        return [g.label for g in cmp.groups]
    return [r.run.name + (" (baseline)" if r is cmp.baseline else "") for r in cmp.reports]


def is_stable(cell: str) -> bool:
    """A stability cell that reports no instability ("stable", or "stable 3/3" for a group)."""
    return cell == STABLE or cell.startswith(f"{STABLE} ")


def rich_table(cmp: Comparison, rows: list[Row]) -> Table:
    runs = f"{len(cmp.reports)} run(s)"
    if cmp.groups is not None:
        runs += f" in {len(cmp.groups)} seed group(s), mean ± 95% t interval"
    title = f"gspo compare: {runs}, x = {cmp.x}, smooth = {cmp.smooth}"
    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("", style="bold", no_wrap=True)
    for header in headers(cmp):
        table.add_column(Text(header), overflow="fold")
    for label, cells in rows:
        # Text, not markup: run names and intervals may hold square brackets.
        unstable = label == "stability"
        styled = [Text(c, style="red" if unstable and not is_stable(c) else "") for c in cells]
        table.add_row(Text(label), *styled)
    return table


def markdown_table(cmp: Comparison, rows: list[Row]) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    names = headers(cmp)
    lines = ["| | " + " | ".join(esc(h) for h in names) + " |"]
    lines.append("|---" * (len(names) + 1) + "|")
    lines += [
        f"| {esc(label)} | " + " | ".join(esc(c) for c in cells) + " |" for label, cells in rows
    ]
    return "\n".join(lines) + "\n"
