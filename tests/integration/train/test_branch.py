"""`gspo train RECIPE --from RUN/checkpoints/step_N`: a new run from another run's checkpoint.
With no change it reproduces the parent from step N record for record; a change the checkpoint
allows (the learning rate) is printed and taken; one it does not (the model) is one line; the
parent is never written; `gspo compare` draws the branch from its step on. Bad sources, a
deleted step and a branch into a run that has begun are one line, exit 2."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gspo_cli.compare.runs import Problems, load_run
from gspo_cli.runs.marker import lineage
from tests.support.helpers import gspo_train, invoke_cli, run_metrics, write_recipe

pytestmark = pytest.mark.slow


def _samples(run: Path, after: int) -> list[str]:
    lines = (run / "samples.jsonl").read_text().splitlines()
    return [r["completion"] for r in map(json.loads, lines) if r["step"] > after]


def _snapshot(run: Path) -> dict[str, float]:
    return {str(p.relative_to(run)): p.stat().st_mtime for p in run.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory, sft_checkpoint: Path) -> tuple[Path, Path]:
    """(the recipe, a finished 4-step run of it with checkpoints at steps 2 and 4)."""
    folder = tmp_path_factory.mktemp("branch")
    recipe = write_recipe(
        folder,
        {
            "model": {"path": str(sft_checkpoint)},
            "trainer": {"steps": 4, "checkpoint_every": 2, "keep_checkpoints": 2},
            "eval": {"every": 2},
        },
    )
    run = folder / "parent"
    result = gspo_train(recipe, "--out", str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    return recipe, run


def test_a_branch_reproduces_its_parent_and_takes_allowed_changes(
    parent: tuple[Path, Path], tmp_path: Path
) -> None:
    recipe, parent_run = parent
    before = _snapshot(parent_run)
    child = tmp_path / "child"
    source = parent_run / "checkpoints" / "step_000002"
    same = gspo_train(recipe, "--out", str(child), "--from", str(source))
    assert same.returncode == 0, same.stderr[-2000:]
    assert "branch: from" in same.stdout and "(step 2)" in same.stdout
    a, b = run_metrics(parent_run), run_metrics(child)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "reward_mean", "grad_norm", "response_len_mean"):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert _samples(child, 2) == _samples(parent_run, 2)
    assert lineage(child) == {"parent": str(parent_run.resolve()), "step": 2}
    assert _snapshot(parent_run) == before  # the parent is never written

    faster = tmp_path / "faster"
    lr = ["--set", "optimizer.lr=2e-5"]
    changed = gspo_train(
        recipe, "--out", str(faster), "--from", str(parent_run), "--step", "2", *lr
    )
    assert changed.returncode == 0, changed.stderr[-2000:]
    assert "branch: optimizer.lr" in changed.stdout and "-> 2e-05" in changed.stdout
    assert run_metrics(faster)[3]["lr"] != a[3]["lr"]

    shown = load_run(child, Problems(Console(file=io.StringIO())))
    assert shown is not None and [int(r["step"]) for r in shown.records] == [2, 3, 4]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "model.path=builtin:tiny-moe"], "--from: model.path differ from"),
        (["--resume"], "--from starts a new run"),
    ],
)
def test_what_cannot_branch_is_one_line(
    parent: tuple[Path, Path], tmp_path: Path, extra: list[str], message: str
) -> None:
    recipe, parent_run = parent
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    args = ["--out", str(tmp_path / "kid"), "--from", str(parent_run)]
    result = gspo_train(recipe, *args, *extra)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "kid").exists()  # a refused branch leaves no folder


def test_a_branch_never_writes_into_a_run(parent: tuple[Path, Path], tmp_path: Path) -> None:
    recipe, parent_run = parent
    into = gspo_train(recipe, "--out", str(parent_run), "--from", str(parent_run))
    assert into.returncode == 2 and "needs its own folder" in into.stderr, into.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / ".gspo-run").write_text(json.dumps({"kind": "run"}))
    (other / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.0}) + "\n")
    begun = gspo_train(recipe, "--out", str(other), "--from", str(parent_run))
    assert begun.returncode == 2 and "already exists" in begun.stderr, begun.stderr


def test_a_runs_checkpoints_evaluate_as_one_curve_and_resume(
    parent: tuple[Path, Path], tmp_path: Path
) -> None:
    """`gspo eval RUN --benchmark custom --steps all`: each kept checkpoint, one curve."""
    _, run = parent
    data = tmp_path / "problems.jsonl"
    rows = [{"id": f"p{i}", "question": f"Compute {i}+1.", "answer": str(i + 1)} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run / "eval" / "custom-curve"  # the default: the run folder's own
    args = ["eval", str(run), "--benchmark", "custom", "--data", str(data), "--samples", "2"]
    args += ["--max-new-tokens", "8", "--steps", "all"]
    first = invoke_cli(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    curve = json.loads((out / "curve.json").read_text())
    assert [p["step"] for p in curve["points"]] == [2, 4]
    assert all("avg@2" in p["metrics"] for p in curve["points"]), curve
    assert (out / "curve.png").stat().st_size > 0
    table = (out / "curve.md").read_text()
    assert "| 2 |" in table and "| 4 |" in table
    again = invoke_cli(*args)  # resumable: a finished step is not run again
    assert again.returncode == 0 and again.stdout.count("done already") == 2, again.stdout
    bad = invoke_cli(*args[:-1], "3")
    assert bad.returncode == 2 and "keeps no checkpoint at step 3 (kept: 2, 4)" in bad.stderr
    # gspo compare draws the curve beside the held-out curve when it is in the run folder
    compared = invoke_cli("compare", str(run), "--out", str(tmp_path / "cmp"))
    assert compared.returncode == 0, compared.stderr[-2000:]
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert "custom avg@2 first → last" in summary
    assert any("curve" in p.name for p in (tmp_path / "cmp").glob("*.png"))


def test_sources_that_name_no_checkpoint_are_one_line(
    parent: tuple[Path, Path], tmp_path: Path
) -> None:
    from gspo_cli.core.errors import GspoError
    from gspo_cli.train.run.branch import branch_source

    _, run = parent
    with pytest.raises(
        GspoError, match=r"no checkpoint step_000001 \(kept: step_000002, step_000004"
    ):
        branch_source(run, 1)
    with pytest.raises(GspoError, match="is neither a run folder nor a checkpoint"):
        branch_source(tmp_path, None)
    assert branch_source(run, None)[1].name == "step_000004"  # the latest
