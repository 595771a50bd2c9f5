"""The DeepSpeed engine on CPU (gloo): equal to plain torch, world-size invariant, resumable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.helpers import gspo_train, invoke_cli, kill_during_run, run_cli, write_recipe

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

STEPS = 4
COMPARED = ("loss", "grad_norm", "reward_mean", "seq_ratio_mean", "clip_frac", "response_len_mean")


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], steps: range) -> None:
    for step in steps:
        # a step whose rows were all skipped has no ratio statistics, in both runs
        for key in (k for k in COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.fixture(scope="module")
def ds_recipe(sft_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ds")
    return write_recipe(
        folder,
        {
            "model": {"path": str(sft_checkpoint)},
            "trainer": {"steps": STEPS, "checkpoint_every": 2, "out_dir": str(folder / "runs")},
            "algorithm": {"minibatches": 2},
            "rollout": {"seed_per_prompt": True},
        },
    )


def _train(recipe: Path, out: Path, *extra: str) -> Path:
    result = gspo_train(recipe, "--out", str(out), *extra)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return out


# Each configuration is trained once per module and shared by the tests that compare with it.
DEEPSPEED, ZERO2, TWO = (
    ("--set", "trainer.engine=deepspeed"),
    ("--set", "deepspeed.zero_stage=2"),
    (
        "--nproc",
        "2",
    ),
)


@pytest.fixture(scope="module")
def runs(ds_recipe: Path) -> Path:
    return ds_recipe.parent / "runs"


@pytest.fixture(scope="module")
def torch_run(ds_recipe: Path, runs: Path) -> Path:
    return _train(ds_recipe, runs / "torch")


@pytest.fixture(scope="module")
def zero2_one_process(ds_recipe: Path, runs: Path) -> Path:
    return _train(ds_recipe, runs / "zero2-one", *DEEPSPEED, *ZERO2)


@pytest.fixture(scope="module")
def zero2_two_processes(ds_recipe: Path, runs: Path) -> Path:
    return _train(ds_recipe, runs / "zero2-two", *DEEPSPEED, *ZERO2, *TWO)


def test_one_process_reproduces_the_plain_torch_engine(
    torch_run: Path, zero2_one_process: Path
) -> None:
    a, b = _metrics(torch_run), _metrics(zero2_one_process)
    assert any(a[s]["grad_norm"] > 0 for s in a), "no gradient signal: the test would be vacuous"
    _same(a, b, range(1, STEPS + 1))


def test_two_processes_zero2_reproduce_one_process(
    zero2_one_process: Path, zero2_two_processes: Path
) -> None:
    a, b = _metrics(zero2_one_process), _metrics(zero2_two_processes)
    _same(a, b, range(1, STEPS + 1))
    checkpoints = zero2_two_processes / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_000002", "step_000004"]
    hf = checkpoints / "step_000004"
    assert (hf / "config.json").is_file() and (hf / "model.safetensors").is_file()


def test_resume_after_kill_with_two_processes(
    ds_recipe: Path, zero2_two_processes: Path, tmp_path: Path
) -> None:
    ds = (*DEEPSPEED, *ZERO2, *TWO)
    killed = tmp_path / "killed"
    stopped_at = kill_during_run(["train", str(ds_recipe), "--out", str(killed), *ds], killed)
    assert stopped_at < STEPS, "the run ended before it could be killed"
    _train(ds_recipe, killed, *ds, "--resume")
    a, b = _metrics(zero2_two_processes), _metrics(killed)
    assert sorted(b) == list(range(1, STEPS + 1))
    _same(a, b, range(stopped_at + 1, STEPS + 1))


def test_resume_at_another_world_size_is_refused_clearly(
    ds_recipe: Path, zero2_two_processes: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(zero2_two_processes, run)  # the shared run stays untouched
    result = run_cli(
        "train",
        str(ds_recipe),
        "--out",
        str(run),
        *DEEPSPEED,
        *ZERO2,
        "--set",
        f"trainer.steps={STEPS + 1}",
        "--resume",
    )
    assert result.returncode == 2
    assert "resume with --nproc 2" in result.stderr


def test_nproc_needs_the_deepspeed_engine(ds_recipe: Path, tmp_path: Path) -> None:
    result = invoke_cli("train", str(ds_recipe), "--out", str(tmp_path / "r"), "--nproc", "2")
    assert result.returncode == 2 and "trainer.engine: deepspeed" in result.stderr


def test_zero0_resumes_at_another_world_size(ds_recipe: Path, tmp_path: Path) -> None:
    zero0 = ("--set", "trainer.engine=deepspeed", "--set", "deepspeed.zero_stage=0")
    _train(ds_recipe, tmp_path / "run", *zero0, "--nproc", "2")
    _train(ds_recipe, tmp_path / "run", *zero0, "--set", f"trainer.steps={STEPS + 1}", "--resume")
    assert sorted(_metrics(tmp_path / "run")) == list(range(1, STEPS + 2))


def test_async_rollouts_two_processes_zero3_reproduce_one_process(
    ds_recipe: Path, runs: Path
) -> None:
    """One rollout worker per rank, each sampling its rank's share from weights ZeRO-3
    gathers for it: the same steps as one process with one worker."""
    one_step_behind = ("--set", "rollout.max_staleness=1")
    zero3 = ("--set", "deepspeed.zero_stage=3")
    a = _metrics(_train(ds_recipe, runs / "async-torch", *one_step_behind))
    b = _metrics(
        _train(ds_recipe, runs / "async-zero3", *DEEPSPEED, *zero3, *TWO, *one_step_behind)
    )
    assert any(a[s]["grad_norm"] > 0 for s in a), "no gradient signal: the test would be vacuous"
    assert [b[s]["rollout_staleness"] for s in b] == [0, 1, 1, 1]
    _same(a, b, range(1, STEPS + 1))


def test_nproc_prints_the_recipe_summary_once(tmp_path: Path) -> None:
    """The launching process says what runs; its ranks used to say it again, one line each."""
    recipe = write_recipe(
        tmp_path,
        {
            "trainer": {"steps": 1, "engine": "deepspeed", "out_dir": str(tmp_path / "runs")},
            "deepspeed": {"zero_stage": 0},
            "algorithm": {"minibatches": 1},
            "eval": {"num_problems": 2, "samples": 1},
        },
    )
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"), "--nproc", "2")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert result.stdout.count("gspo train run: ") == 1, result.stdout
