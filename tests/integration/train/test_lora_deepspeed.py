"""LoRA under DeepSpeed on CPU (gloo), 2 processes: ZeRO-3 trains the adapters as the
plain-torch engine does (KL reference included), saves them, and resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.helpers import run_cli, write_recipe

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

STEPS = 3
COMPARED = ("loss", "grad_norm", "kl", "reward_mean", "clip_frac", "response_len_mean")
PARITY = """
def parity(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]
"""


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _adapters(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recipe with signal on the random built-in model (a parity reward), LoRA and a KL term."""
    folder = tmp_path_factory.mktemp("lora-ds")
    (folder / "lora_ds_rewards.py").write_text(PARITY)
    write_recipe(
        folder,
        {
            "model": {"lora": {"r": 4, "alpha": 16, "target_modules": ["q_proj", "o_proj"]}},
            "reward": {"functions": [{"name": "lora_ds_rewards:parity"}]},
            "rollout": {"seed_per_prompt": True},
            "algorithm": {"minibatches": 2, "kl_coef": 0.05},
            "optimizer": {"lr": 5e-2},
            "trainer": {"steps": STEPS, "checkpoint_every": 1, "keep_checkpoints": 3, "seed": 3},
        },
    )
    return folder


def _train(folder: Path, out: str, *extra: str) -> Path:
    # the reward module is found from the working folder, with no PYTHONPATH
    result = run_cli("train", "recipe.yaml", "--out", out, *extra, cwd=folder)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return folder / out


@pytest.fixture(scope="module")
def torch_run(folder: Path) -> Path:
    return _train(folder, "torch")


def _zero(stage: int) -> tuple[str, ...]:
    return ("--set", "trainer.engine=deepspeed", "--set", f"deepspeed.zero_stage={stage}")


# ZeRO-3 only: its partitioned parameters and gathered adapters hold everything ZeRO-2 does for
# LoRA, plus the gather (ZeRO-2 with LoRA ran alike; CI's time is better spent elsewhere)
@pytest.mark.parametrize("stage", [3])
def test_two_processes_train_the_adapters_as_plain_torch(
    folder: Path, torch_run: Path, stage: int
) -> None:
    run = _train(folder, f"zero{stage}", *_zero(stage), "--nproc", "2")
    a, b = _metrics(torch_run), _metrics(run)
    assert any(a[s]["reward_std"] > 0 for s in a), "no signal: the test would be vacuous"
    for step in range(1, STEPS + 1):
        for key in (k for k in COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)
    plain, sharded = _adapters(torch_run, STEPS), _adapters(run, STEPS)
    assert plain.keys() == sharded.keys()
    for key, tensor in plain.items():
        torch.testing.assert_close(sharded[key], tensor, rtol=1e-3, atol=1e-3)

    if stage == 3:  # a resume from step 2 repeats step 3
        resumed = folder / "zero3-resumed"
        shutil.copytree(run, resumed)
        shutil.rmtree(resumed / "checkpoints" / f"step_{STEPS:06d}")
        (resumed / "checkpoints" / "latest").write_text(f"step_{STEPS - 1:06d}")
        _train(folder, "zero3-resumed", *_zero(3), "--nproc", "2", "--resume")
        again = _metrics(resumed)
        for key in (k for k in COMPARED if k in b[STEPS]):
            assert again[STEPS][key] == pytest.approx(b[STEPS][key], rel=1e-6), key
        final = _adapters(resumed, STEPS)
        for key, tensor in sharded.items():
            torch.testing.assert_close(final[key], tensor, rtol=1e-6, atol=1e-7)
