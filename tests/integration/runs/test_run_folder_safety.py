"""A user's files are never lost: gspo writes only in folders of its own (the run marker), a
--resume needs a run to resume, and every printed command and path is printed verbatim."""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from gspo_cli.models import load_policy
from gspo_cli.recipe import load_recipe
from gspo_cli.runs.folder import RUN_MARKER
from gspo_cli.runs.marker import RUN, mark_folder
from gspo_cli.train.engines.torch_engine import TorchEngine, UpdateFailed
from tests.support.helpers import invoke_cli, one_error_line, write_recipe

QUICK = {"model": {"path": "builtin:tiny-dense"}, "trainer": {"steps": 1, "checkpoint_every": 1}}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _problems(folder: Path) -> Path:
    path = folder / "problems.jsonl"
    path.write_text(json.dumps({"question": "Compute 1+2.", "answer": "3"}) + "\n")
    return path


@pytest.mark.parametrize("command", ["train", "sft"])
def test_out_into_a_folder_of_user_files_is_refused_and_nothing_is_touched(
    tmp_path: Path, command: str
) -> None:
    """`gspo train --out .` in the user's own folder: it used to overwrite their recipe.yaml
    and append to their samples.jsonl, exit 0."""
    recipe = write_recipe(tmp_path, QUICK)
    (tmp_path / "samples.jsonl").write_text('{"prompt": "mine", "answer": "1"}\n')
    before = _snapshot(tmp_path)
    result = invoke_cli(command, str(recipe), "--out", str(tmp_path))
    one_error_line(result, f"{tmp_path} is not empty and is not a gspo run folder", "--out")
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml", "samples.jsonl"]


def test_eval_out_into_a_folder_of_user_files_is_refused_and_nothing_is_touched(
    tmp_path: Path,
) -> None:
    data = _problems(tmp_path)
    (tmp_path / "samples.jsonl").write_text('{"id": "mine"}\n')
    before = _snapshot(tmp_path)
    args = ["builtin:tiny-dense", "--benchmark", "custom", "--data", str(data)]
    for resume in ([], ["--resume"]):
        result = invoke_cli("eval", *args, "--out", str(tmp_path), *resume)
        one_error_line(result, f"{tmp_path} is not empty and is not a gspo eval output folder")
    assert _snapshot(tmp_path) == before


def test_an_empty_folder_becomes_a_marked_run_folder_that_eval_will_not_write_in(
    tmp_path: Path,
) -> None:
    recipe = write_recipe(tmp_path, QUICK)
    out = tmp_path / "empty"
    out.mkdir()  # e.g. a mount point: empty, so it may be used
    result = invoke_cli("train", str(recipe), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / RUN_MARKER).read_text())["kind"] == RUN
    before = _snapshot(out)
    args = ["builtin:tiny-dense", "--benchmark", "custom", "--data", str(_problems(tmp_path))]
    refused = invoke_cli("eval", *args, "--out", str(out))
    one_error_line(refused, f"{out} is a gspo run folder, not a gspo eval output folder")
    assert _snapshot(out) == before


def test_a_run_folder_of_an_older_version_without_the_marker_still_resumes(
    tmp_path: Path,
) -> None:
    """Legacy run folders (checkpoints/ and metrics.jsonl, no marker) are accepted and marked."""
    recipe = write_recipe(tmp_path, QUICK)
    out = tmp_path / "run"
    first = invoke_cli("train", str(recipe), "--out", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    (out / RUN_MARKER).unlink()  # as an older gspo left it
    resumed = invoke_cli(
        "train", str(recipe), "--out", str(out), "--resume", "--set", "trainer.steps=2"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 1)" in resumed.stdout
    assert (out / RUN_MARKER).is_file()
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_resume_of_a_folder_without_a_run_is_refused(tmp_path: Path) -> None:
    """A mistyped --out with --resume used to start a new run from step 0."""
    recipe = write_recipe(tmp_path, QUICK)
    missing = tmp_path / "tpyo"
    result = invoke_cli("train", str(recipe), "--out", str(missing), "--resume")
    one_error_line(result, f"--resume: {missing} does not exist, so there is no run to resume")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke_cli("train", str(recipe), "--out", str(empty), "--resume")
    one_error_line(result, f"--resume: {empty} is empty, so there is no run to resume")
    assert list(empty.iterdir()) == []


def test_eval_of_a_run_folder_without_a_checkpoint_says_what_it_is(tmp_path: Path) -> None:
    run = tmp_path / "run"
    mark_folder(run, RUN)
    (run / "recipe.yaml").write_text("name: x\n")  # what a start that failed early leaves
    args = ["--benchmark", "custom", "--data", str(_problems(tmp_path))]
    result = invoke_cli("eval", str(run), *args, "--out", str(tmp_path / "ev"))
    one_error_line(result, f"{run} is a run folder with no checkpoint yet")


def test_an_error_line_prints_a_path_with_brackets_verbatim(tmp_path: Path) -> None:
    """Rich markup used to eat `[v2]` from the path in the error line."""
    missing = tmp_path / "[v2]x.jsonl"
    recipe = write_recipe(tmp_path, {**QUICK, "data": {"source": str(missing)}})
    result = invoke_cli("validate", str(recipe))
    one_error_line(result, f"data.source: file not found: {missing}")


def test_a_guard_stop_prints_a_resume_command_with_brackets_that_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's `resume with:` line, pasted as printed, with a bracketed --set value."""
    recipe = write_recipe(tmp_path, {**QUICK, "trainer": {"steps": 2, "checkpoint_every": 1}})
    out = tmp_path / "run"
    targets = "model.lora.target_modules=[q_proj,v_proj]"
    sets = ["--set", "model.lora.r=4", "--set", targets]
    fail_at = load_recipe(recipe).algorithm.minibatches + 1  # step 2's first update
    real_step = TorchEngine.step
    updates = []

    def failing_step(self: TorchEngine, skip: bool = False) -> tuple[float, bool]:
        updates.append(1)
        if len(updates) == fail_at:
            raise UpdateFailed("an update with a non-finite gradient norm")
        return real_step(self, skip)

    with monkeypatch.context() as patch:
        patch.setattr(TorchEngine, "step", failing_step)
        stopped = invoke_cli("train", str(recipe), "--out", str(out), *sets)
    line = one_error_line(stopped, "stopped at step 2", "resume with: ")
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["gspo", "train"] and targets in command, command
    resumed = invoke_cli(*command[1:])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 1)" in resumed.stdout  # the checkpoint the stop line named
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["model"]["lora"]["target_modules"] == ["q_proj", "v_proj"]


def _usual_mode(directory: bool) -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


@pytest.mark.parametrize("kind", ["new folder", "empty mount point"])
def test_export_writes_into_an_empty_mount_point_with_the_usual_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Docker's `-v out:/out`: an empty folder that cannot be renamed over or removed (EBUSY,
    simulated: root ignores a read-only parent). It used to fail naming the parent and EBUSY;
    exported weights came out 0600."""
    checkpoint = tmp_path / "checkpoint"
    model, tokenizer = load_policy("builtin:tiny-dense")
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path / "out"
    if kind == "empty mount point":
        out.mkdir()
        _busy(monkeypatch, out)
    result = invoke_cli("export", str(checkpoint), str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in checkpoint.iterdir())
    assert not list(tmp_path.glob(".*.tmp")) and not list(out.glob(".*"))  # no staging left
    assert (out / "model.safetensors").read_bytes() == (
        checkpoint / "model.safetensors"
    ).read_bytes()
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == _usual_mode(False), path
    assert stat.S_IMODE(out.stat().st_mode) == _usual_mode(True)


def _busy(monkeypatch: pytest.MonkeyPatch, mount: Path) -> None:
    """Renaming `mount` (or onto it) and removing it fail as on a mount point."""

    def guarded(real: Any) -> Any:
        def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            if mount in (Path(src), Path(dst)):
                raise OSError(errno.EBUSY, "Device or resource busy", str(src))
            return real(src, dst, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "rename", guarded(os.rename))
    monkeypatch.setattr(os, "replace", guarded(os.replace))
    real_rmdir = os.rmdir

    def rmdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path) == mount:
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir)


def test_compare_of_a_missing_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": s, "reward_mean": 0.1 * s} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    missing = tmp_path / "tpyo"
    result = invoke_cli("compare", str(run), str(missing), "--out", str(tmp_path / "o"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.strip().splitlines() == [  # compare reports on stdout, as it goes
        f"error: {missing}: no such folder (check the path); nothing compared"
    ]
    assert not (tmp_path / "o").exists()
