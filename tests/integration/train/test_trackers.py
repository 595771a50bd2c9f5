"""`logging.backends: [tensorboard, mlflow, trackio]`: a short run and its resume, read back by
each backend's own reader (tensorboard's event files, the mlflow store, trackio's local store):
every step's metrics as metrics.jsonl has them, held-out results, the recipe, one tracker run
continued by the resume. Their files stay in the run folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import run_cli, run_metrics, write_recipe

pytestmark = pytest.mark.slow
for package in ("tensorboard", "mlflow", "trackio"):
    pytest.importorskip(package, reason="the trackers extra (make setup installs it)")

READER = """
import json, os, sys
run = sys.argv[1]
os.environ["TRACKIO_DIR"] = os.path.join(run, "trackio")  # before trackio is imported
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from mlflow.tracking import MlflowClient
from trackio.sqlite_storage import SQLiteStorage
board = EventAccumulator(os.path.join(run, "tensorboard"))
board.Reload()
client = MlflowClient("file://" + os.path.join(run, "mlruns"))
run_id = open(os.path.join(run, "mlflow_run_id")).read().strip()
found = {
    "tensorboard": [[e.step, e.value] for e in board.Scalars("response_len_mean")],
    "tensorboard_heldout": [e.step for e in board.Scalars("heldout/accuracy")],
    "tensorboard_recipe": "recipe/text_summary" in board.Tags()["tensors"],
    "mlflow": [[m.step, m.value] for m in client.get_metric_history(run_id, "response_len_mean")],
    "mlflow_runs": len(client.search_runs([client.get_run(run_id).info.experiment_id])),
    "mlflow_param": client.get_run(run_id).data.params.get("rollout.group_size"),
    "trackio": [[r["step"], r["response_len_mean"]]
                for r in SQLiteStorage.get_logs("gspo-cli", "trk") if "response_len_mean" in r],
    "tensorboard_samples": "samples/text_summary" in board.Tags()["tensors"],
    "mlflow_samples": [a.path for a in client.list_artifacts(run_id, "samples")],
    "trackio_samples": [r["step"] for r in SQLiteStorage.get_logs("gspo-cli", "trk")
                        if "samples" in r],
}
print(json.dumps(found))
"""


def test_each_backend_reads_back_what_a_run_and_its_resume_wrote(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        {
            "name": "trk",
            "model": {"path": "builtin:tiny-dense"},
            "logging": {"backends": ["tensorboard", "mlflow", "trackio"]},
            "trainer": {"steps": 2, "checkpoint_every": 2},
            "eval": {"every": 2},
        },
    )
    run = tmp_path / "run"
    first = run_cli("train", str(recipe), "--out", str(run))
    assert first.returncode == 0, first.stderr[-2000:]
    more = run_cli("train", str(recipe), "--out", str(run), "--resume", "--set", "trainer.steps=3")
    assert more.returncode == 0, more.stderr[-2000:]
    expected = [[s, r["response_len_mean"]] for s, r in sorted(run_metrics(run).items())]
    assert [s for s, _ in expected] == [1, 2, 3]
    read = subprocess.run(
        [sys.executable, "-c", READER, str(run.resolve())], capture_output=True, text=True
    )
    assert read.returncode == 0, read.stderr[-2000:]
    found = json.loads(read.stdout.strip().splitlines()[-1])
    for backend in ("tensorboard", "mlflow", "trackio"):
        steps = [step for step, _ in found[backend]]
        values = [value for _, value in found[backend]]
        assert steps == [1, 2, 3], (backend, found[backend])
        assert values == pytest.approx([v for _, v in expected]), backend
    assert found["tensorboard_heldout"] == [0, 2, 3] and found["tensorboard_recipe"]
    assert found["mlflow_runs"] == 1 and found["mlflow_param"] == "4"  # one run, continued
    # the steps' samples, as tables where the backend has them
    assert found["tensorboard_samples"] and found["trackio_samples"]
    assert "samples/step_000001.json" in found["mlflow_samples"], found["mlflow_samples"]


def test_a_missing_package_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import importlib.util\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'trackio' else _find(n, *a)\n"
    )
    recipe = write_recipe(tmp_path, {"logging": {"backends": ["trackio"]}})
    result = run_cli("validate", str(recipe), env={"PYTHONPATH": str(shim)})
    assert result.returncode == 2
    assert "trackio needs the trackio package: pip install 'gspo-cli[trackers]'" in result.stderr


def test_an_unreachable_tracker_server_is_one_line_before_training(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        {
            "model": {"path": "builtin:tiny-dense"},
            "logging": {"backends": ["mlflow"], "mlflow_uri": "http://127.0.0.1:9"},
        },
    )
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: logging.backends: mlflow could not start"), line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
