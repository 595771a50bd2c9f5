"""`gspo eval RUN --benchmark NAME --steps all|50,100`: a run's checkpoints evaluated one by one,
as one curve of the benchmark's metrics against the training step.

Each checkpoint is an ordinary evaluation in its own folder (`OUT/step_N`, default OUT:
RUN/eval/NAME-curve): a finished one (its results.json) is not run again and a partial one is
resumed, so the whole curve resumes after a stop. The curve (`curve.json`, `curve.md`,
`curve.png`) is written from the steps' results each time, with each metric's interval.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.eval.runner import EvalSettings, run_eval
from gspo_cli.runs.folder import CHECKPOINTS, RESULTS, write_bytes_atomic, write_text_atomic
from gspo_cli.runs.marker import is_run_folder
from gspo_cli.runs.retention import checkpoints, step_of

CURVE = "curve.json"
CURVE_MD = "curve.md"
CURVE_PNG = "curve.png"


def curve_checkpoints(run: Path, steps: str) -> list[Path]:
    """The run's checkpoint folders `steps` names ("all": every kept one), oldest first;
    GspoError naming a step the run does not keep."""
    if not is_run_folder(run):
        raise GspoError(f"--steps: {run} is not a gspo run folder (a curve is a run's)")
    kept = {step_of(folder): folder for folder in checkpoints(run / CHECKPOINTS)}
    if not kept:
        raise GspoError(f"--steps: {run} keeps no checkpoint")
    if steps.strip() == "all":
        return [kept[s] for s in sorted(kept)]
    try:
        wanted = sorted({int(part) for part in steps.split(",") if part.strip()})
    except ValueError:
        raise GspoError(f"--steps {steps!r}: write all, or steps such as 50,100") from None
    missing = [s for s in wanted if s not in kept]
    if missing or not wanted:
        raise GspoError(
            f"--steps: {run} keeps no checkpoint at step {missing[0] if missing else '?'} "
            f"(kept: {', '.join(str(s) for s in sorted(kept))})"
        )
    return [kept[s] for s in wanted]


def evaluate_curve(
    run: Path, steps: str, settings: EvalSettings, out: Path, console: Console
) -> dict[str, Any]:
    """Evaluate each checkpoint `steps` names into OUT/step_N (resuming), then write the curve."""
    folders = curve_checkpoints(run, steps)
    for folder in folders:
        target = out / folder.name
        if (target / RESULTS).is_file():
            console.print(f"{folder.name}: done already ({target / RESULTS})", highlight=False)
            continue
        resume = target.is_dir() and any(target.iterdir())
        console.print(f"{folder.name}: evaluating {folder}", highlight=False)
        run_eval(dataclasses.replace(settings, checkpoint=str(folder)), target,
                 resume=resume, console=console)  # fmt: skip
    curve = _curve(settings.benchmark, run, [out / folder.name for folder in folders])
    write_text_atomic(out / CURVE, json.dumps(curve, indent=2))
    write_text_atomic(out / CURVE_MD, _table(curve))
    write_bytes_atomic(out / CURVE_PNG, _plot(curve))
    console.print(f"curve: {out / CURVE} ({out / CURVE_MD}, {out / CURVE_PNG})", highlight=False)
    return curve


def _curve(benchmark: str, run: Path, folders: list[Path]) -> dict[str, Any]:
    points = []
    for folder in folders:
        results = json.loads((folder / RESULTS).read_text(encoding="utf-8"))
        points.append({"step": step_of(folder), "metrics": results.get("metrics", {})})
    return {"benchmark": benchmark, "run": str(run), "points": points}


def _entry(value: Any) -> tuple[float, float | None, float | None] | None:
    from gspo_cli.compare.results import parse_entry

    return parse_entry(value)


def _names(curve: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for point in curve["points"]:
        names += [n for n, v in point["metrics"].items() if n not in names and _entry(v)]
    return names


def _table(curve: dict[str, Any]) -> str:
    names = _names(curve)
    lines = [f"# {curve['benchmark']} over the run {curve['run']}", ""]
    lines += ["| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for point in curve["points"]:
        cells = []
        for name in names:
            parsed = _entry(point["metrics"].get(name))
            if parsed is None:
                cells.append("")
                continue
            value, low, high = parsed
            interval = "" if low is None or high is None else f" [{low:.4g}, {high:.4g}]"
            cells.append(f"{value:.4g}{interval}")
        lines.append(f"| {point['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(curve: dict[str, Any]) -> bytes:
    """A PNG: each metric against the step, its interval shaded."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in _names(curve):
        rows = [(p["step"], _entry(p["metrics"].get(name))) for p in curve["points"]]
        rows = [(step, parsed) for step, parsed in rows if parsed is not None]
        steps = [step for step, _ in rows]
        ax.plot(steps, [parsed[0] for _, parsed in rows], marker="o", label=name)
        if all(parsed[1] is not None and parsed[2] is not None for _, parsed in rows):
            low = [parsed[1] for _, parsed in rows]
            high = [parsed[2] for _, parsed in rows]
            ax.fill_between(steps, low, high, alpha=0.2)  # type: ignore[arg-type]
    ax.set_xlabel("training step")
    ax.set_title(f"{curve['benchmark']}: {Path(curve['run']).name}")
    ax.legend(fontsize="small")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()
