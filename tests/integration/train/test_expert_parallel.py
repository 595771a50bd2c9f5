"""Expert parallelism (`deepspeed.expert_parallel`, DeepSpeed AutoEP) on CPU with gloo: the tiny
Qwen3-MoE on two processes with EP = 2 (each rank holds 4 of the 8 experts of every layer,
tokens travel to their experts by all-to-all) trains as EP = 1 does on two processes and as one
process does, at ZeRO-2, with GSPO and with GRPO plus Routing Replay R3 and the router aux
loss (R2 under EP is the same replay of recorded experts, recorded by the trainer's pi_old
forward: test_deepspeed_moe.py holds R2 at ZeRO 0); and at ZeRO-3 with GSPO; `gspo export` of
its checkpoints (ZeRO-2 and 3) is a plain HF model with whole experts whose logits are the
EP = 1 run's; a run killed at EP = 2 resumes exactly.

Tolerances: as tests/integration/train/test_deepspeed_moe.py (losses, gradient norms and ratios to
1e-4 relative: the ranks' sums run in another order; expert volatility to 1e-6 absolute, a
discrete count the float differences have not flipped); the router aux loss to 1e-4 relative;
exported logits to 1e-4 absolute (logits of magnitude about 10).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.helpers import (
    TrainedRuns,
    assert_same_moe_runs,
    invoke_cli,
    run_cli,
)

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

DEEPSPEED = ("--set", "trainer.engine=deepspeed", "--nproc", "2", "--set", "deepspeed.zero_stage=2")
EP2 = ("--set", "deepspeed.expert_parallel=2")
GRPO_R3_AUX = (
    *("--set", "algorithm.name=grpo", "--set", "algorithm.routing_replay=rollout"),
    *("--set", "algorithm.router_aux_coef=0.01"),
)
ZERO3 = ("--set", "deepspeed.zero_stage=3")


def test_ep2_reproduces_ep1_and_one_process(moe_runs: TrainedRuns) -> None:
    ep2 = moe_runs(*DEEPSPEED, *EP2)
    assert_same_moe_runs(moe_runs(*DEEPSPEED), ep2)
    assert_same_moe_runs(moe_runs(), ep2)


def test_ep2_routing_replay_r3_and_aux_loss_reproduce_ep1(moe_runs: TrainedRuns) -> None:
    """R3 replays the experts recorded while generating (synced generation under EP), and the
    aux loss reads the AutoEP router's gate."""
    one = moe_runs(*GRPO_R3_AUX, *DEEPSPEED)
    two = moe_runs(*GRPO_R3_AUX, *DEEPSPEED, *EP2)
    assert_same_moe_runs(one, two)
    for step in one:
        assert one[step]["router_aux_loss"] > 0
        assert two[step]["router_aux_loss"] == pytest.approx(one[step]["router_aux_loss"], rel=1e-4)


def test_ep2_zero3_reproduces_ep1(moe_runs: TrainedRuns) -> None:
    assert_same_moe_runs(moe_runs(*DEEPSPEED), moe_runs(*DEEPSPEED, *EP2, *ZERO3))


def _logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.arange(3, 43).reshape(2, 20)
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_of_ep2_is_a_plain_hf_model_equal_to_ep1(
    moe_runs: TrainedRuns, tmp_path: Path
) -> None:
    from safetensors import safe_open

    runs = {
        "ep1": moe_runs.folder(*DEEPSPEED),
        "ep2": moe_runs.folder(*DEEPSPEED, *EP2),
        "ep2-zero3": moe_runs.folder(*DEEPSPEED, *EP2, *ZERO3),
    }
    exported = {}
    for name, run in runs.items():
        result = invoke_cli("export", str(run), str(tmp_path / name))
        assert result.returncode == 0, result.stdout + result.stderr
        exported[name] = tmp_path / name
    with safe_open(str(exported["ep1"] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not any("router" in k or ".w1" in k for k in keys)
    reference = _logits(exported["ep1"])
    for name in ("ep2", "ep2-zero3"):
        with safe_open(str(exported[name] / "model.safetensors"), "pt") as f:
            assert set(f.keys()) == keys, name  # the HF layout, every expert of every layer
        logits = _logits(exported[name])
        assert torch.allclose(logits, reference, atol=1e-4), float((logits - reference).abs().max())


def test_ep2_resumes_exactly_after_kill(
    moe_recipe: Path, moe_runs: TrainedRuns, tmp_path: Path
) -> None:
    moe_runs.assert_resume_is_exact(tmp_path / "killed", *DEEPSPEED, *EP2)


def test_resume_at_another_ep_is_refused(moe_recipe: Path, moe_runs: TrainedRuns) -> None:
    """The recipe check refuses it in the launching process, before any rank starts (the
    engine checks the checkpoint's expert_parallel.json again:
    tests/unit/train/test_expert_parallel_config.py)."""
    run = moe_runs.folder(*DEEPSPEED, *EP2)
    result = run_cli("train", str(moe_recipe), "--out", str(run), *DEEPSPEED, "--resume")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "error: --resume: deepspeed.expert_parallel differ from" in result.stderr
