"""The quickstart trained once per seed with each algorithm option, compared seed-grouped.

Each recipe (default: `recipes/quickstart.yaml`, GSPO, and one `recipes/quickstart-*.yaml` per
option) runs its whole quickstart (cold start, 100 RL steps) for each seed into
DIR/<name>-s<seed>, then `gspo compare --group-seeds --baseline <first run>` writes the table and
plots to DIR/comparison (mean over seeds with 95% Student-t intervals; held-out accuracy is 200
problems x 4 samples). Since every option of one seed starts from the same cold start, it also
prints (and writes to DIR/comparison/paired.md) each option's difference from the first recipe
paired by seed: final held-out accuracy and final reward, mean and 95% t interval of the
per-seed differences, which is far narrower than the unpaired intervals of the table.

    .venv/bin/python benchmarks/compare_algorithms.py DIR [--recipes a.yaml,b.yaml]
        [--seeds 1,2,3] [--jobs 2]

The cold start depends on the seed only (the recipes compared share their model, data and
`cold_start` sections), so it runs once per seed (`gspo sft` of the first recipe) and each run
starts from a copy of it (a run reuses the cold start it finds in its folder): every option of
one seed starts from the same weights. Runs go `--jobs` at a time with one torch thread each
(about 4 minutes a run on this 2-core machine), and a finished run (its summary.json exists) is
not run again, so an interrupted comparison picks up where it stopped. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gspo_cli.compare.intervals import Estimate
from gspo_cli.runs.folder import COLD_START, HF_CONFIG, METRICS, RUN_MARKER

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
DEFAULT_RECIPES = [
    "quickstart.yaml",
    "quickstart-dynamic-sampling.yaml",
    "quickstart-overlong.yaml",
    "quickstart-kl.yaml",
    "quickstart-entropy.yaml",
    "quickstart-luspo.yaml",
    "quickstart-sapo.yaml",
    "quickstart-gmpo.yaml",
    "quickstart-cispo.yaml",
]
GSPO = [sys.executable, "-m", "gspo_cli.cli"]


def _gspo(command: str, recipe: Path, seed: int, folder: Path, *extra: str) -> None:
    """`gspo COMMAND recipe` for one seed into `folder`, one torch thread, output to a log."""
    sets = ["--set", f"name={folder.name}", "--set", f"trainer.seed={seed}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = folder.parent / f"{folder.name}.log"
    with log.open("w") as handle:
        args = [*GSPO, command, str(recipe), *sets, "--out", str(folder), *extra]
        done = subprocess.run(args, stdout=handle, stderr=subprocess.STDOUT, env=env)
    print(f"{folder.name}: exit {done.returncode} ({log})", flush=True)


def _cold_start(recipe: Path, seed: int, out: Path) -> Path:
    """The cold-start run folder of `recipe` (the first one compared) for `seed`, made once."""
    folder = out / f"cold-start-s{seed}"
    if not (folder / COLD_START / HF_CONFIG).exists():
        _gspo("sft", recipe, seed, folder)
    return folder


def _train(recipe: Path, seed: int, out: Path, cold_starts: dict[int, Path]) -> Path:
    """Train one seed of one recipe into out/<recipe stem>-s<seed> (skipped when finished)."""
    folder, cold_start = out / f"{recipe.stem}-s{seed}", cold_starts[seed]
    if not (folder / "summary.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        # The run marker makes the folder ours for `--resume`, which then finds its cold start.
        shutil.copy2(cold_start / RUN_MARKER, folder / RUN_MARKER)
        shutil.copytree(cold_start / COLD_START, folder / COLD_START, dirs_exist_ok=True)
        _gspo("train", recipe, seed, folder, "--resume")
    return folder


def _finals(folder: Path) -> tuple[float, float]:
    """(held-out accuracy after the last step, mean reward of the last 10 steps) of a run."""
    heldout = json.loads((folder / "summary.json").read_text())["heldout_accuracy"]
    last = (folder / METRICS).read_text().strip().splitlines()[-10:]
    reward = sum(json.loads(line)["reward_mean"] for line in last) / len(last)
    return heldout[str(max(int(step) for step in heldout))], reward


def paired_table(folders: dict[tuple[str, int], Path], recipes: list[str], seeds: list[int]) -> str:
    """Markdown: each recipe against the first, per-seed differences' mean and 95% interval."""
    lines = [
        f"Paired by seed against `{recipes[0]}` (same cold start per seed): mean difference of "
        "the seeds' final values ± the half-width of its 95% Student-t interval; * where the "
        "interval excludes 0.",
        "",
        "| recipe | held-out accuracy (points) | reward, last 10 steps | seeds |",
        "|---|---|---|---|",
    ]
    for recipe in recipes[1:]:
        pairs = [s for s in seeds if (recipe, s) in folders and (recipes[0], s) in folders]
        if len(pairs) < 2:
            continue
        ours = [_finals(folders[recipe, s]) for s in pairs]
        base = [_finals(folders[recipes[0], s]) for s in pairs]
        cells = []
        for column, scale in ((0, 100), (1, 1)):
            gaps = [(a[column] - b[column]) * scale for a, b in zip(ours, base, strict=True)]
            est = Estimate.of(gaps, len(pairs))
            low, high = est.ci_low or 0.0, est.ci_high or 0.0
            star = " *" if low > 0 or high < 0 else ""
            cells.append(f"{est.mean:+.3g} ± {high - est.mean:.2g}{star}")
        lines.append(f"| {recipe} | {cells[0]} | {cells[1]} | {', '.join(map(str, pairs))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    recipes = [RECIPES / name for name in args.recipes.split(",")]  # or absolute paths
    seeds = [int(seed) for seed in args.seeds.split(",")]
    jobs = [(recipe, seed) for recipe in recipes for seed in seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        made = pool.map(lambda seed: _cold_start(recipes[0], seed, args.out), seeds)
        starts = dict(zip(seeds, made, strict=True))
        folders = list(pool.map(lambda job: _train(job[0], job[1], args.out, starts), jobs))
    finished = [str(folder) for folder in folders if (folder / "summary.json").exists()]
    if not finished:
        raise SystemExit("no run finished: see the logs in " + str(args.out))
    baseline = str(args.out / f"{recipes[0].stem}-s{seeds[0]}")
    compare = [*GSPO, "compare", *finished, "--group-seeds", "--baseline", baseline]
    subprocess.run([*compare, "--out", str(args.out / "comparison")], check=True)
    done = {
        (recipe.stem, seed): args.out / f"{recipe.stem}-s{seed}"
        for recipe, seed in jobs
        if (args.out / f"{recipe.stem}-s{seed}" / "summary.json").exists()
    }
    table = paired_table(done, [recipe.stem for recipe in recipes], seeds)
    (args.out / "comparison" / "paired.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
