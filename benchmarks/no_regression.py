"""Did training on one task cost the model elsewhere? `gspo eval` of several checkpoints on the
shared GSM8K and MATH-500 copies, side by side.

Each checkpoint (NAME=PATH: a run folder, a checkpoint, builtin:smollm2-135m for the model as
shipped) is evaluated on the first `--limit` problems of each benchmark (the copies in
../shared/benchmarks, or `--data`) into DIR/<name>/<benchmark> with `gspo eval --resume` (an
interrupted comparison picks up where it stopped, a finished one is not sampled again, and other
settings for the same folder are refused), one after the other. Then a markdown table:
strict accuracy (avg@k: the last \\boxed{} right), answered (an answer in that form) and right in
any form, each with its 95% bootstrap interval over problems (a response cut at the cap is read
for a box or an answer marker only, never its last number: rewards/answer_forms.py); the share
of responses cut at the cap, and right in any form counting only responses that ended (a check
for a sceptic: what a cut response's box or marker adds); and each checkpoint's difference from
the first one in right in any form, paired by problem (95% bootstrap interval of the mean
per-problem difference). Written to DIR/no_regression.md.

    .venv/bin/python benchmarks/no_regression.py DIR base=builtin:smollm2-135m \\
        full=runs/real-slips/smollm2-slips-s1 [--benchmarks gsm8k,math500] [--limit 200] \\
        [--samples 1] [--max-new-tokens 256]

The figures depend on the sampling (temperature 0.6, top-p 0.95, seed 0: `gspo eval`'s
defaults), the response cap (a truncated response has no answer) and the prompt (each
benchmark's own instruction to box the answer). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gspo_cli.eval.metrics import bootstrap_ci
from gspo_cli.runs.folder import RESULTS, SAMPLES

GSPO = [sys.executable, "-m", "gspo_cli.cli"]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"  # ../shared beside the repo


def _evaluate(path: str, benchmark: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`gspo eval` of one checkpoint on one benchmark (resumed): its results.json, and under
    "per_problem" each problem's (right in any form, right in any form and ended) rates."""
    command = [
        *GSPO, "eval", path, "--benchmark", benchmark, "--limit", str(args.limit),
        "--samples", str(args.samples), "--max-new-tokens", str(args.max_new_tokens),
        "--data", str(args.data / benchmark), "--out", str(folder),
    ]  # fmt: skip
    if folder.is_dir() and any(folder.iterdir()):  # done problems kept, other settings refused
        command.append("--resume")
    subprocess.run(command, check=True)
    results: dict[str, Any] = json.loads((folder / RESULTS).read_text())
    results["per_problem"] = {}
    for line in (folder / SAMPLES).read_text().splitlines():
        record = json.loads(line)
        right, cut = record["correct_any_form"], record["truncated"]
        ended = [r and not c for r, c in zip(right, cut, strict=True)]
        results["per_problem"][record["id"]] = (sum(right) / len(right), sum(ended) / len(ended))
    return results


def _share(values: list[float]) -> str:
    low, high = bootstrap_ci(values)
    return f"{100 * sum(values) / len(values):.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def _paired(results: dict[str, Any], first: dict[str, Any]) -> str:
    """Right in any form minus the first checkpoint's, problem by problem (the same problems)."""
    if results is first:
        return "(reference)"
    ours, theirs = results["per_problem"], first["per_problem"]
    gaps = [ours[key][0] - theirs[key][0] for key in ours if key in theirs]
    low, high = bootstrap_ci(gaps)
    return f"{100 * sum(gaps) / len(gaps):+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def _cell(metric: dict[str, float] | None) -> str:
    if metric is None:  # right in any form is for maths; old samples lack answered
        return "n/a"
    low, high = 100 * metric["ci_low"], 100 * metric["ci_high"]
    return f"{100 * metric['value']:.1f}% [{low:.1f}, {high:.1f}]"


def table(
    rows: dict[tuple[str, str], dict[str, Any]], names: list[str], benchmarks: list[str]
) -> str:
    """Markdown: one line per (checkpoint, benchmark), strict / answered / any form / cut /
    any form among ended responses / any form paired against the first checkpoint."""
    lines = [
        "| checkpoint | benchmark | problems x samples | accuracy (strict) | answered "
        "| right in any form | cut at the cap | right in any form, ended | any form vs first |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for benchmark in benchmarks:
            results = rows[name, benchmark]
            metrics = results["metrics"]
            strict = metrics[f"avg@{results['sampling']['samples']}"]
            forms = [metrics.get("answered"), metrics.get("accuracy_any_form")]
            cells = [_cell(strict), *map(_cell, forms), f"{100 * metrics['truncated_frac']:.1f}%"]
            ended = [pair[1] for pair in results["per_problem"].values()]
            cells += [_share(ended), _paired(results, rows[names[0], benchmark])]
            size = f"{results['problems']} x {results['sampling']['samples']}"
            lines.append(f"| {name} | {benchmark} | {size} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("checkpoints", nargs="+", help="NAME=PATH")
    parser.add_argument("--benchmarks", default="gsm8k,math500")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--data", type=Path, default=SHARED, help="a folder per benchmark")
    args = parser.parse_args()
    pairs = [item.split("=", 1) for item in args.checkpoints]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit("each checkpoint is NAME=PATH")
    benchmarks = args.benchmarks.split(",")
    rows = {
        (name, benchmark): _evaluate(path, benchmark, args.out / name / benchmark, args)
        for name, path in pairs
        for benchmark in benchmarks
    }
    text = table(rows, [name for name, _ in pairs], benchmarks)
    (args.out / "no_regression.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
