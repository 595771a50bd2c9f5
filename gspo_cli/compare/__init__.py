"""`gspo compare`: runs side by side as a table, PNG plots, summary.md and summary.json.

Entry point: `compare_runs`. Module map: runs/results (read run folders), series (curves,
smoothing, x axes), verdicts (stability), stats (numbers and differences), seeds and intervals
(--group-seeds: seed groups, means and 95% t intervals), table (rich and markdown), plots
(matplotlib Agg PNGs), report (summary files).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gspo_cli.compare.plots import write_plots
from gspo_cli.compare.report import remove_stale_plots, write_reports, written_by_compare
from gspo_cli.compare.runs import Problems, Run, load_runs
from gspo_cli.compare.seeds import group_runs
from gspo_cli.compare.series import HELDOUT, HELDOUT_FORMS, RATIO_SPREAD, X_LABELS, X_SOURCES
from gspo_cli.compare.stats import Comparison, compare
from gspo_cli.compare.table import Row, build_rows, rich_table
from gspo_cli.runs.folder import RECIPE

__all__ = ["DEFAULT_OUT", "compare_runs"]

# Reused (overwritten) by every comparison that names no --out; printed at the end.
DEFAULT_OUT = Path("comparisons") / "latest"
EXIT_OK, EXIT_NOTHING = 0, 2


def selected_metrics(
    metrics: list[str] | None, runs: list[Run], problems: Problems
) -> list[str] | None:
    """--metrics as a list ("a,b" items are split); a name no run has is reported."""
    if metrics is None:
        return None
    names = list(dict.fromkeys(n.strip() for item in metrics for n in item.split(",")))
    names = [n for n in names if n]
    if not names:
        return None
    known = {k for run in runs for record in run.records for k in record} | {"eval"}
    known |= {HELDOUT} if any(run.heldout for run in runs) else set()
    known |= {k for k, form in HELDOUT_FORMS.items() if any(form in r.heldout_forms for r in runs)}
    known |= {RATIO_SPREAD} if "seq_ratio_max" in known and "seq_ratio_min" in known else set()
    for name in names:
        if name not in known:
            problems.warning(
                "--metrics", f"no run has {name!r} (known: {', '.join(sorted(known))})"
            )
    return names


def _check_axis(runs: list[Run], x: str, problems: Problems) -> None:
    if x not in X_SOURCES:
        return
    for run in runs:
        if not run.has(X_SOURCES[x]):
            problems.warning(
                run.path, f"no {X_SOURCES[x]} in metrics.jsonl: left out of the plots against {x}"
            )


def _without_recipe(runs: list[Run], problems: Problems) -> bool:
    """--group-seeds groups by the saved recipe: report (one line) the runs that have none."""
    lacking = [str(run.path) for run in runs if not run.recipe]
    if lacking:
        problems.error(
            "--group-seeds",
            f"runs are grouped by their saved {RECIPE}, which is missing or unreadable in "
            f"{', '.join(lacking)}; nothing compared",
        )
    return bool(lacking)


def compare_runs(
    run_dirs: list[Path],
    *,
    metrics: list[str] | None = None,
    x: str = "step",
    smooth: int = 1,
    out: Path | None = None,
    baseline: Path | None = None,
    group_seeds: bool = False,
    console: Console,
) -> int:
    """Compare run folders; return 0 when at least one run was compared, else 2.

    x: "step", "tokens" (cumulative completion_tokens) or "time" (cumulative time_step_s).
    smooth: trailing moving-average window in steps (1 = raw). metrics: restricts the curves
    plotted and the rows tabled (None = all). out: the output folder (None = DEFAULT_OUT).
    baseline: the run differences are taken against (None = the first valid run).
    group_seeds: runs whose recipes differ only in trainer.seed (see seeds) become one column
    each: means over seeds with 95% t intervals, curves with shaded bands. A run without a
    readable recipe.yaml then returns 2.
    Every problem is printed as one line `error|warning: <where>: <what>`; invalid folders are
    skipped. A folder that does not exist (a mistyped path), an unusable --x/--smooth, no valid
    run, or an unwritable out folder return 2.
    """
    problems = Problems(console)
    if not _usable_arguments(run_dirs, x, smooth, problems):
        return EXIT_NOTHING
    runs, base = load_runs(run_dirs, baseline, problems)
    if not runs or base is None:
        problems.error("runs", f"none of the {len(run_dirs)} folder(s) given is a valid run")
        return EXIT_NOTHING
    if group_seeds and _without_recipe(runs, problems):
        return EXIT_NOTHING
    wanted = selected_metrics(metrics, runs, problems)
    _check_axis(runs, x, problems)
    cmp = compare(runs, base, x, smooth, wanted)
    if group_seeds:
        cmp.groups = group_runs(cmp.reports, problems)
    rows = build_rows(cmp)
    console.print(rich_table(cmp, rows))
    out_dir = Path(out) if out is not None else DEFAULT_OUT
    plots = _write_outputs(cmp, rows, out_dir, problems)
    if plots is None:
        return EXIT_NOTHING
    console.print(
        f"wrote {len(plots)} plot(s), summary.md and summary.json to {out_dir}",
        highlight=False,
        markup=False,
    )
    return EXIT_OK


def _usable_arguments(run_dirs: list[Path], x: str, smooth: int, problems: Problems) -> bool:
    """Whether --x, --smooth and the folders given can be used; each refusal is one line."""
    if x not in X_LABELS:
        problems.error("--x", f"unknown axis {x!r}; choose one of: {', '.join(X_LABELS)}")
        return False
    if smooth < 1:
        problems.error("--smooth", f"the window must be at least 1 step, got {smooth}")
        return False
    missing = [path for path in run_dirs if not path.exists()]
    for path in missing:  # a mistyped path: refused, not compared without it
        problems.error(path, "no such folder (check the path); nothing compared")
    return not missing


def _write_outputs(
    cmp: Comparison, rows: list[Row], out_dir: Path, problems: Problems
) -> list[Path] | None:
    """The plots and summary files in `out_dir` (stale plots removed first); the plots written,
    or None when the folder cannot be written, or holds files a comparison did not write
    (one line)."""
    if not written_by_compare(out_dir):
        problems.error(
            out_dir,
            "holds files gspo compare did not write, which it would replace; give --out a new "
            "or empty folder, or one an earlier comparison wrote",
        )
        return None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_plots(out_dir)
        plots = write_plots(cmp, out_dir)
        write_reports(cmp, rows, plots, problems.lines, out_dir)
    except OSError as exc:
        problems.error(out_dir, f"cannot write the comparison ({exc.strerror or exc})")
        return None
    return plots
