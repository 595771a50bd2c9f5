"""summary.json (the numbers) and summary.md (the table and the plots), written atomically.

The output folder is reused between comparisons: plots listed in a previous summary.json that
this comparison does not draw are removed, so summary.md never sits next to stale images.
With --group-seeds, summary.json also has "groups" (seeds.group_summary: per group its seeds,
runs, verdicts and every number as mean, ci_low, ci_high and each seed's value), and summary.md
lists each group's seeds and runs above the grouped table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gspo_cli.compare.seeds import group_summary
from gspo_cli.compare.series import X_LABELS
from gspo_cli.compare.stats import Comparison
from gspo_cli.compare.table import Row, markdown_table
from gspo_cli.compare.verdicts import (
    ENTROPY_FLOOR_FRACTION,
    REWARD_DROP_FRACTION,
    VERDICT_WINDOW,
    verdict_text,
)
from gspo_cli.runs.folder import SUMMARY, SUMMARY_MD, write_text_atomic


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: non-finite numbers become null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def summary_data(cmp: Comparison, plots: list[Path], problems: list[str]) -> dict[str, Any]:
    runs = [
        {
            "name": r.run.name,
            "path": str(r.run.path),
            "baseline": r is cmp.baseline,
            **r.stats,
            "stable": not r.issues,
            "verdict": verdict_text(r.issues),
            "issues": [{"kind": i.kind, "step": i.step, "detail": i.detail} for i in r.issues],
            "delta_vs_baseline": r.deltas,
        }
        for r in cmp.reports
    ]
    data: dict[str, Any] = _finite(
        {
            "x": cmp.x,
            "smooth": cmp.smooth,
            "metrics": cmp.metrics,
            "baseline": cmp.baseline.run.name,
            "common_x": cmp.common_x,
            "thresholds": {
                "verdict_window_steps": VERDICT_WINDOW,
                "reward_drop_fraction_of_range": REWARD_DROP_FRACTION,
                "entropy_floor_fraction_of_initial": ENTROPY_FLOOR_FRACTION,
            },
            "runs": runs,
            **({"groups": [group_summary(g) for g in cmp.groups]} if cmp.groups else {}),
            "plots": [p.name for p in plots],
            "problems": problems,
        }
    )
    return data


def _run_list(cmp: Comparison) -> list[str]:
    if cmp.groups is None:
        return [f"- `{r.run.name}`: `{r.run.path}`" for r in cmp.reports]
    return [
        f"- `{g.label}`: "
        + ", ".join(f"seed {s} `{r.run.path}`" for s, r in zip(g.seeds, g.reports, strict=True))
        for g in cmp.groups
    ]


def summary_markdown(
    cmp: Comparison, rows: list[Row], plots: list[Path], problems: list[str]
) -> str:
    about = f"baseline: {cmp.baseline.run.name}."
    if cmp.groups is not None:
        about = (
            "runs grouped by seed: each number is the mean over the seeds ± the half-width of "
            "its 95% Student-t interval; curves are the mean with the interval shaded."
        )
    lines = [
        "# gspo compare",
        "",
        f"x axis: {X_LABELS[cmp.x]}; smoothing: trailing mean over {cmp.smooth} step(s); {about}",
        "",
        *_run_list(cmp),
        "",
        markdown_table(cmp, rows),
    ]
    if problems:
        lines += ["## Problems", "", *[f"- {p}" for p in problems], ""]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}]({p.name})\n" for p in plots]
    return "\n".join(lines)


def written_by_compare(out_dir: Path) -> bool:
    """Whether `out_dir` is new, empty, or holds a comparison's summary.json: the folders
    `gspo compare` may write into (it never replaces files it did not write)."""
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return True
    try:
        previous = json.loads((out_dir / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(previous, dict) and {"x", "baseline", "runs"} <= previous.keys()


def remove_stale_plots(out_dir: Path) -> None:
    """Delete the plots a previous comparison listed in summary.json (only those)."""
    try:
        previous = json.loads((out_dir / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    names = previous.get("plots") if isinstance(previous, dict) else None
    for name in names if isinstance(names, list) else []:
        # Only bare PNG names: a hand-edited summary must not point us elsewhere.
        if isinstance(name, str) and name.endswith(".png") and Path(name).name == name:
            (out_dir / name).unlink(missing_ok=True)


def write_reports(
    cmp: Comparison, rows: list[Row], plots: list[Path], problems: list[str], out_dir: Path
) -> None:
    data = summary_data(cmp, plots, problems)
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    write_text_atomic(out_dir / SUMMARY, text)
    write_text_atomic(out_dir / SUMMARY_MD, summary_markdown(cmp, rows, plots, problems))
