"""`gspo train` runs each of GSPO's successors (LUSPO, SAPO, GMPO, CISPO, DPPO TV and KL,
VESPO) for two steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import invoke_cli

TOKEN_MEAN = ("cispo", "dppo_tv", "dppo_kl", "vespo")  # their papers' aggregation


@pytest.mark.parametrize("name", ["luspo", "sapo", "gmpo", "cispo", "dppo_tv", "dppo_kl", "vespo"])
def test_two_training_steps(name: str, tiny_recipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(
        algorithm={"name": name, "minibatches": 2},
        rollout={"max_new_tokens": 16},
        trainer={"steps": 2, "checkpoint_every": 2},
    )
    run = tmp_path / "run"
    result = invoke_cli("train", str(recipe), "--out", str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    metrics = {rec["step"]: rec for rec in map(json.loads, lines)}
    assert sorted(metrics) == [1, 2]
    trained = [rec for rec in metrics.values() if rec["zero_adv_skipped_frac"] < 1]
    assert trained, "no step had a learning signal"
    for rec in trained:
        assert math.isfinite(rec["loss"]) and math.isfinite(rec["grad_norm"])
        assert rec["grad_norm"] > 0
        assert 0 <= rec["clip_frac"] <= 1
        if name in ("sapo", "vespo"):  # no hard clip
            assert rec["clip_frac"] == 0
    resolved = yaml.safe_load((run / "recipe.yaml").read_text())["algorithm"]
    assert resolved["name"] == name
    assert resolved["loss_agg"] == ("token_mean" if name in TOKEN_MEAN else "seq_mean_token_mean")
