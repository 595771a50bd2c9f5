"""`gspo compare --group-seeds` on fixture runs: which runs are grouped, the t intervals of the
table and summary.json against hand-computed ones, the banded plots, and the errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gspo_cli.compare import compare_runs
from gspo_cli.compare.intervals import t975
from gspo_cli.compare.runs import Problems, load_runs
from gspo_cli.compare.seeds import group_band, group_runs
from gspo_cli.compare.stats import SeedGroup, compare
from tests.support.compare_runs import (
    console_text,
    metrics_row,
    png_size,
    recording_console,
    write_run,
)
from tests.support.helpers import invoke_cli

T2 = 4.302653  # t(0.975, 2 degrees of freedom), from a printed t table: 4.303


def seed_run(
    root: Path,
    folder: str,
    seed: int,
    rewards: list[float],
    *,
    algorithm: str = "gspo",
    name: str | None = None,
    evals: dict[int, float] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    planned: int | None = None,
) -> Path:
    """A run of recipe `name` (default paper-<algorithm>) with trainer.seed = `seed`: reward
    rewards[i] at step i + 1, and recipe keys overridden by `{section: {key: value}}`."""
    rows = [metrics_row(s, r, 1.0 - 0.01 * s, expert_volatility=0.1 + 0.01 * seed)
            for s, r in enumerate(rewards, start=1)]  # fmt: skip
    run = write_run(
        root, folder, rows, algorithm=algorithm, planned=planned or len(rewards), evals=evals
    )
    saved = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    saved["name"] = name or f"paper-{algorithm}"
    saved["trainer"].update(seed=seed, out_dir=str(root))
    for section, values in (overrides or {}).items():
        saved.setdefault(section, {}).update(values)
    (run / "recipe.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    return run


def flat(value: float, steps: int = 10) -> list[float]:
    return [value] * steps


def _groups(paths: list[Path], smooth: int = 1) -> tuple[list[SeedGroup], Problems]:
    problems = Problems(recording_console())
    runs, base = load_runs(paths, None, problems)
    assert base is not None
    cmp = compare(runs, base, "step", smooth, None)
    return group_runs(cmp.reports, problems), problems


def hand_interval(values: list[float]) -> tuple[float, float]:
    """mean and t(0.975, n-1) * s / sqrt(n), written out."""
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T2 * s / math.sqrt(n)


@pytest.fixture
def six(tmp_path: Path) -> list[Path]:
    """GSPO and GRPO, seeds 1-3 each, given interleaved: final rewards 0.50/0.52/0.57 (GSPO)
    and 0.40/0.45/0.41 (GRPO); held-out accuracy at steps 0, 5, 10."""
    root = tmp_path / "runs"
    paths = []
    for seed, (g, r) in enumerate(zip((0.50, 0.52, 0.57), (0.40, 0.45, 0.41), strict=True), 1):
        evals = {0: 0.2, 5: 0.3 + 0.01 * seed, 10: 0.4 + 0.02 * seed}
        paths.append(seed_run(root, f"gspo-s{seed}", seed, flat(g), evals=evals))
        paths.append(seed_run(root, f"grpo-s{seed}", seed, flat(r), algorithm="grpo", evals=evals))
    return paths


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t975(2) == pytest.approx(4.3027, abs=1e-4)
    assert t975(30) == pytest.approx(2.0423, abs=1e-4)
    # Past the table: the expansion, against printed values (t(0.975, 60) = 2.000, 120: 1.980).
    assert t975(60) == pytest.approx(2.0003, abs=1e-4)
    assert t975(120) == pytest.approx(1.9799, abs=1e-4)
    assert t975(31) < t975(30)


def test_three_seeds_of_two_recipes_make_two_groups(six: list[Path]) -> None:
    groups, problems = _groups(six)
    assert [g.label for g in groups] == ["paper-gspo (3 seeds)", "paper-grpo (3 seeds)"]
    assert [g.seeds for g in groups] == [[1, 2, 3], [1, 2, 3]]
    assert [r.run.name for r in groups[1].reports] == ["grpo-s1", "grpo-s2", "grpo-s3"]
    assert problems.lines == []


def test_group_interval_is_the_t_interval(six: list[Path], tmp_path: Path) -> None:
    out, console = tmp_path / "out", recording_console()
    assert compare_runs(six, out=out, group_seeds=True, console=console) == 0
    mean, half = hand_interval([0.50, 0.52, 0.57])  # 0.530 ± 0.0896
    assert (round(mean, 3), round(half, 3)) == (0.53, 0.09)
    text = console_text(console)
    final = next(line for line in text.splitlines() if line.startswith("│ final reward"))
    assert f"{mean:.3f} ± {half:.3f}" in final  # "0.530 ± 0.090"
    g_mean, g_half = hand_interval([0.40, 0.45, 0.41])
    assert f"{g_mean:.3f} ± {g_half:.3f}" in final
    assert "paper-gspo (3 seeds)" in text and "stable 3/3" in text
    seeds_row = next(line for line in text.splitlines() if line.startswith("│ seeds"))
    assert seeds_row.count("1, 2, 3") == 2
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    gspo = summary["groups"][0]
    assert (gspo["label"], gspo["seeds"]) == ("paper-gspo (3 seeds)", [1, 2, 3])
    assert gspo["runs"] == ["gspo-s1", "gspo-s2", "gspo-s3"]
    final_json = gspo["metrics"]["final_reward"]
    assert final_json["values"] == pytest.approx([0.50, 0.52, 0.57])
    assert final_json["mean"] == pytest.approx(mean)
    assert final_json["ci_low"] == pytest.approx(mean - half, abs=1e-6)
    assert final_json["ci_high"] == pytest.approx(mean + half, abs=1e-6)
    heldout = gspo["metrics"]["heldout_last"]  # 0.42, 0.44, 0.46
    assert heldout["mean"] == pytest.approx(0.44)
    assert heldout["ci_high"] - 0.44 == pytest.approx(hand_interval([0.42, 0.44, 0.46])[1])
    assert gspo["verdict"] == "stable 3/3" and gspo["settings"]["algorithm"] == "gspo"
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "| | paper-gspo (3 seeds) | paper-grpo (3 seeds) |" in md
    assert f"| final reward | {mean:.3f} ± {half:.3f} |" in md


def test_group_plots_exist_with_bands(six: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert compare_runs(six, out=out, group_seeds=True, console=recording_console()) == 0
    expected = {
        "reward_mean", "heldout_accuracy", "clip_frac", "ratio_spread", "entropy",
        "grad_norm", "response_len_mean", "expert_volatility",
    }  # fmt: skip
    pngs = sorted(out.glob("*.png"))
    assert {p.stem for p in pngs} == expected
    assert all(png_size(p) == (800, 450) for p in pngs)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert set(summary["plots"]) == {p.name for p in pngs}
    # The held-out band: at the eval steps only, mean and t interval of the seeds there.
    groups, _ = _groups(six)
    band = group_band(groups[0], "heldout_accuracy", "step", 1)
    assert band is not None and band.xs.tolist() == [0, 5, 10]
    mean, half = hand_interval([0.42, 0.44, 0.46])
    assert band.mean[2] == pytest.approx(mean)
    assert (band.low[2], band.high[2]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert (band.low[0], band.high[0]) == (pytest.approx(0.2), pytest.approx(0.2))  # no width


def test_band_uses_steps_common_to_all_seeds(tmp_path: Path) -> None:
    """A seed still at step 6 of 10 limits the group's curve to steps 1..6; each seed is
    smoothed before the mean."""
    paths = [
        seed_run(tmp_path, "a", 1, [0.1 * s for s in range(1, 11)]),
        seed_run(tmp_path, "b", 2, [0.2 * s for s in range(1, 7)], planned=10),
    ]
    groups, _ = _groups(paths)
    assert [g.label for g in groups] == ["paper-gspo (2 seeds)"]
    band = group_band(groups[0], "reward_mean", "step", 2)
    assert band is not None and band.xs.tolist() == [1, 2, 3, 4, 5, 6]
    # Step 4, trailing mean over 2 steps: seed 1 (0.3 + 0.4) / 2, seed 2 (0.6 + 0.8) / 2.
    a, b = 0.35, 0.7
    half = 12.706205 * abs(a - b) / math.sqrt(2) / math.sqrt(2)
    assert band.mean[3] == pytest.approx((a + b) / 2)
    assert band.high[3] - band.mean[3] == pytest.approx(half)
    assert np.all(band.low <= band.high)
    console = recording_console()
    assert compare_runs(paths, out=tmp_path / "o", group_seeds=True, console=console) == 0
    steps = next(line for line in console_text(console).splitlines() if "steps done" in line)
    assert "seed 1: 10/10; seed 2: 6/10 (in progress)" in steps


def test_seeds_differing_in_another_key_are_not_merged(tmp_path: Path) -> None:
    paths = [
        seed_run(tmp_path, "s1", 1, flat(0.5)),
        seed_run(tmp_path, "s2", 2, flat(0.6)),
        seed_run(tmp_path, "s3", 3, flat(0.7), overrides={"algorithm": {"clip_high": 5e-4}}),
    ]
    groups, problems = _groups(paths)
    assert [g.label for g in groups] == ["paper-gspo (2 seeds)", "paper-gspo (1 seed) #2"]
    assert [g.seeds for g in groups] == [[1, 2], [3]]
    assert problems.lines == [
        "warning: --group-seeds: paper-gspo (2 seeds) and paper-gspo (1 seed) differ in "
        "algorithm.clip_high: not merged"
    ]
    # One seed: the value alone, no interval.
    single = groups[1].view.stats["final_reward"]
    assert f"{single:.3f}" == "0.700" and single.ci_low is None


def test_seed_suffix_of_name_out_dir_and_logging_are_ignored(tmp_path: Path) -> None:
    paths = [
        seed_run(
            tmp_path / "a",
            "x-s1",
            1,
            flat(0.5),
            name="x-s1",
            overrides={"logging": {"console": "plain"}},
        ),
        seed_run(tmp_path / "b", "x-seed2", 2, flat(0.6), name="x-seed2"),
        # The number is not this run's seed: a different name, a different group.
        seed_run(tmp_path / "c", "x-s9", 3, flat(0.7), name="x-s9"),
    ]
    groups, _ = _groups(paths)
    assert [g.label for g in groups] == ["x (2 seeds)", "x-s9 (1 seed)"]


def test_stability_row_counts_seed_verdicts(tmp_path: Path) -> None:
    collapse = [0.2 + 0.02 * s if s < 25 else 0.05 for s in range(1, 51)]
    paths = [
        seed_run(tmp_path, "s1", 1, flat(0.5, 50)),
        seed_run(tmp_path, "s2", 2, collapse),
        seed_run(tmp_path, "s3", 3, flat(0.6, 50)),
    ]
    console = recording_console()
    assert compare_runs(paths, out=tmp_path / "o", group_seeds=True, console=console) == 0
    row = next(
        line for line in console_text(console).splitlines() if line.startswith("│ stability")
    )
    assert "unstable in 1/3 (seed 2: reward collapse at step 25, reward crash at step 26)" in row


def test_runs_without_recipe_exit_2(six: list[Path], tmp_path: Path) -> None:
    (six[1] / "recipe.yaml").unlink()
    console = recording_console()
    code = compare_runs(six, out=tmp_path / "o", group_seeds=True, console=console)
    assert code == 2
    errors = [line for line in console_text(console).splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --group-seeds: runs are grouped by their saved recipe.yaml, which is missing "
        f"or unreadable in {six[1]}; nothing compared"
    ]
    assert not (tmp_path / "o").exists()
    # Without --group-seeds the same runs are compared as before.
    assert compare_runs(six, out=tmp_path / "o", console=recording_console()) == 0


def test_cli_option(six: list[Path], tmp_path: Path) -> None:
    result = invoke_cli("compare", *map(str, six), "--group-seeds", "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "paper-grpo (3 seeds)" in result.stdout
    (six[0] / "recipe.yaml").unlink()
    result = invoke_cli("compare", *map(str, six), "--group-seeds", "--out", str(tmp_path / "p"))
    assert result.returncode == 2 and "error: --group-seeds:" in result.stdout
