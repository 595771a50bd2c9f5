"""Which checkpoints a run keeps (runs/retention.py): the newest N, the best M by a metric of
metrics.jsonl, every K-th; the best one for `gspo export --best`; and a save the disk cannot
hold refused before it starts (train/run/checkpoint.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.models import create_builtin
from gspo_cli.runs.retention import Retention, best_checkpoint, kept_by
from gspo_cli.train.run.checkpoint import space_problem
from tests.support.helpers import invoke_cli

ACCURACY = {2: 0.30, 4: 0.50, 6: 0.40, 8: 0.50, 10: 0.20}  # held-out accuracy by step


def _folders(root: Path, steps: list[int]) -> list[Path]:
    return [root / f"step_{step:06d}" for step in steps]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (Retention(last=2), [8, 10]),
        (Retention(last=1, best=2), [4, 8, 10]),  # a tie (4 and 8): the later first
        (Retention(last=1, best=1, mode="min"), [10]),  # the newest is also the lowest
        (Retention(last=1, best=1, mode="min", every=4), [4, 8, 10]),
        (Retention(last=1, every=3), [6, 10]),
    ],
)
def test_the_policy_keeps_the_newest_the_best_and_every_kth(
    tmp_path: Path, policy: Retention, expected: list[int]
) -> None:
    folders = _folders(tmp_path, [2, 4, 6, 8, 10])
    keep = kept_by(folders, policy, ACCURACY)
    assert sorted(int(f.name[5:]) for f in keep) == expected


def _run(tmp_path: Path, trainer: dict[str, Any], metric: str = "heldout_accuracy") -> Path:
    """A run folder: an HF checkpoint per step and its metrics.jsonl, no training."""
    run = tmp_path / "run"
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    for folder in _folders(run / "checkpoints", list(ACCURACY)):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    (run / "checkpoints" / "latest").write_text("step_000010")
    records = [{"step": s, metric: a, "reward_mean": 0.1} for s, a in ACCURACY.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "recipe.yaml").write_text(json.dumps({"trainer": trainer}))  # YAML reads JSON
    return run


def test_export_best_takes_the_best_checkpoint_by_the_runs_metric(tmp_path: Path) -> None:
    run = _run(tmp_path, {"best_metric": "heldout_accuracy"})
    assert best_checkpoint(run).name == "step_000008"
    exported = invoke_cli("export", str(run), str(tmp_path / "best"), "--best")
    assert exported.returncode == 0, exported.stderr
    assert "step_000008" in exported.stdout.replace("\n", "")  # the console wraps long paths
    assert (tmp_path / "best" / "config.json").is_file()
    lowest = _run(tmp_path / "min", {"best_metric": "heldout_accuracy", "best_mode": "min"})
    assert best_checkpoint(lowest).name == "step_000010"


def test_export_best_without_the_metric_is_one_line(tmp_path: Path) -> None:
    run = _run(tmp_path, {"best_metric": "pass_rate"})
    with pytest.raises(GspoError, match=r"none of the checkpoints .* has pass_rate"):
        best_checkpoint(run)
    refused = invoke_cli("export", str(run), str(tmp_path / "best"), "--best")
    assert refused.returncode == 2 and "\n" not in refused.stderr.strip()
    assert not (tmp_path / "best").exists()


def test_a_save_the_disk_cannot_hold_is_refused_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "checkpoints"
    (root / "step_000001").mkdir(parents=True)
    (root / "step_000001" / "model.safetensors").write_bytes(b"\0" * 1_000_000)
    (root / "latest").write_text("step_000001")
    assert space_problem(root, "step_000002") is None  # this disk has room for 1 MB
    usage = shutil.disk_usage(root)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=500_000))
    line = space_problem(root, "step_000002")
    assert line is not None and "needs about 0.00 GiB" in line and "step_000001 is intact" in line
    assert space_problem(tmp_path / "new", "step_000001") is None  # a first save: not judged
