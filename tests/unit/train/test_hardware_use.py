"""Hardware use, visible: the counted model FLOPs (models/flops.py), the cached matmul peak
(train/engines/hardware.py) and the MFU a step logs (train/step/utilisation.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from gspo_cli.compare import compare_runs
from gspo_cli.models import create_builtin
from gspo_cli.models.flops import flop_shape, rollout_flops, train_flops
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines import hardware
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.metric_rules import combine, mfu_metrics
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.compare_runs import console_text, metrics_row, recording_console, write_run
from tests.support.rl_helpers import GROUP, PROMPTS, FixedRollout, LengthParityReward, tiny_step

SMALL = {
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "vocab_size": 10,
}


def test_dense_shape_is_the_hand_count() -> None:
    shape = flop_shape(Qwen3Config(**SMALL))
    # per layer: q 8x8, k 8x4, v 8x4, o 8x8, gate/up/down 3 x 8x16 = 576 weights; 2 layers
    assert shape.body == 2 * 2 * (64 + 32 + 32 + 64 + 384)
    assert shape.head == 2 * 8 * 10
    assert shape.attention == 2 * 2 * 2 * 8  # q.k and the values' sum, 2 layers, 2 heads x 4
    # positions 0..2 attend to 1 + 2 + 3 keys; the head on 2 of them
    assert shape.forward(0, 3, 2) == 3 * shape.body + 6 * shape.attention + 2 * shape.head


def test_moe_counts_active_experts_router_and_dense_layers() -> None:
    config = Qwen3MoeConfig(
        **SMALL, moe_intermediate_size=6, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]
    )
    attention_weights = 64 + 32 + 32 + 64
    moe = attention_weights + 8 * 4 + 2 * 3 * 8 * 6  # router, 2 active experts of width 6
    dense = attention_weights + 3 * 8 * 16  # layer 1 is dense (mlp_only_layers)
    assert flop_shape(config).body == 2 * (moe + dense)


def _counted(model: torch.nn.Module, tokens: int) -> int:
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator())
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    return int(counter.get_total_flops())


@pytest.mark.parametrize("moe", [False, True])
def test_forward_matches_flop_counter_mode(moe: bool) -> None:
    """Within 0.1% of torch's FlopCounterMode (it counts the same matmuls; eager attention and
    experts, which it can see). It counts the attention's full square, masked half included:
    the causal count is corrected to that before comparing."""
    dims = {**SMALL, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    dims.update(head_dim=16, intermediate_size=96, vocab_size=50)
    if moe:
        config = Qwen3MoeConfig(
            **dims, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2
        )
        config._experts_implementation = "eager"  # the default grouped_mm is not counted
        model: torch.nn.Module = Qwen3MoeForCausalLM(config)
    else:
        config = Qwen3Config(**dims)
        model = Qwen3ForCausalLM(config)
    config._attn_implementation = "eager"  # CPU SDPA is not counted
    tokens = 24
    shape = flop_shape(config)
    square = shape.attention * (tokens * tokens - tokens * (tokens + 1) // 2)
    expected = shape.forward(0, tokens, tokens) + square  # the head on every position, as HF
    assert _counted(model.eval(), tokens) == pytest.approx(expected, rel=1e-3)


def test_generation_steps_add_up_to_the_row() -> None:
    """Prefill (head on the last prompt position) and R - 1 decoding steps of one token each
    sum to `row`, the training forward's count."""
    shape = flop_shape(Qwen3Config(**SMALL))
    prompt, response = 5, 4
    steps = shape.forward(0, prompt, 1)
    steps += sum(shape.forward(p, p + 1, 1) for p in range(prompt, prompt + response - 1))
    assert shape.row(prompt, response) == steps
    assert rollout_flops(shape, [[1] * prompt] * 2, [[1] * response] * 2) == 2 * steps


def test_train_flops_passes_and_frozen_base() -> None:
    shape = flop_shape(Qwen3Config(**SMALL))
    lengths = [(3, 2), (4, 5), (2, 1)]
    rows = [shape.row(p, r) for p, r in lengths]
    assert train_flops(shape, lengths, [0, 1], []) == 3 * (rows[0] + rows[1])
    with_passes = train_flops(shape, lengths, [1], [[0, 1, 2], [1]])
    assert with_passes == 3 * rows[1] + sum(rows) + rows[1]
    # LoRA: the weights' matmuls take no weight gradient (2 forwards), the attention still 3
    attention = shape.attention * ((4 + 5 - 1) * (4 + 5) // 2)
    assert train_flops(shape, lengths, [1], [], frozen_base=True) == 2 * rows[1] + attention


def test_peak_is_measured_once_per_key_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hardware, "_MEASURED", {})
    measured: list[float] = []
    real = hardware.measure_matmul_peak

    def measure(device: torch.device) -> float:
        measured.append(real(device, size=256))  # the real measurement, small
        return measured[-1]

    monkeypatch.setattr(hardware, "measure_matmul_peak", measure)
    cpu = torch.device("cpu")
    first = hardware.peak_flops(cpu, tmp_path)
    monkeypatch.setattr(hardware, "_MEASURED", {})  # a new process: only the file remains
    assert hardware.peak_flops(cpu, tmp_path) == first
    assert len(measured) == 1 and first > 0
    cached = json.loads((tmp_path / hardware.PEAK_FILE).read_text())
    key = hardware.peak_key(cpu)
    assert cached == {key: first}
    assert f"threads {torch.get_num_threads()}" in key and torch.__version__ in key
    threads = torch.get_num_threads()
    try:  # another thread count is another key: measured, and added beside the first
        torch.set_num_threads(threads + 1)
        hardware.peak_flops(cpu, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(measured) == 2
    assert len(json.loads((tmp_path / hardware.PEAK_FILE).read_text())) == 2


def _scripted_rollout() -> RolloutBatch:
    """4 prompts x GROUP responses of lengths 3..6 (each group's rewards vary: all rows train)."""
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    completions = [[40 + i % 7] * (3 + i % GROUP) + [1] for i in range(len(prompts))]
    texts = ["x" * len(c) for c in completions]
    return RolloutBatch(prompts, completions, None, texts, [False] * len(prompts))


def test_a_step_logs_flops_peak_and_mfu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSPO_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "_MEASURED", {})
    monkeypatch.setattr(hardware, "_RANK_PEAKS", {})
    monkeypatch.setattr(hardware, "measure_matmul_peak", lambda device: 5e10)  # scripted peak
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    recipe = Recipe()
    rollout = _scripted_rollout()
    settings = tiny_step(recipe, sampling=SamplingParams(num_samples=GROUP), tokenizer=tokenizer)
    engine = TorchEngine(model, engine_settings(recipe), LOCAL)
    rows: list[dict[str, Any]] = [{"prompt": "p", "answer": "a"}] * len(PROMPTS)
    metrics = rl_step(
        StepModels(engine), FixedRollout(rollout), LengthParityReward(), PROMPTS, rows, settings, 0
    ).metrics
    shape = flop_shape(model.config)
    per_row = rollout_flops(shape, rollout.prompt_ids, rollout.completion_ids)
    assert metrics["flops_rollout"] == per_row
    assert metrics["flops_train"] == 4 * per_row  # every row trained (3) and pi_old recomputed
    assert metrics["peak_flops"] == 5e10
    assert metrics["mfu_train"] == metrics["flops_train"] / (metrics["time_train_s"] * 5e10)
    assert metrics["mfu_rollout"] == pytest.approx(
        metrics["flops_rollout"] / (metrics["time_rollout_s"] * 5e10)
    )
    assert json.loads((tmp_path / hardware.PEAK_FILE).read_text()) == {
        hardware.peak_key(torch.device("cpu")): 5e10
    }


def test_ranks_sum_flops_and_peaks_over_the_slowest_time() -> None:
    ranks = [
        {"flops_train": 6e9, "peak_flops": 1e10, "time_train_s": 2.0},
        {"flops_train": 2e9, "peak_flops": 1e10, "time_train_s": 4.0},
    ]
    folded = {k: combine(k, [r[k] for r in ranks], [1.0, 1.0]) for k in ranks[0]}
    assert folded == {"flops_train": 8e9, "peak_flops": 2e10, "time_train_s": 4.0}
    assert mfu_metrics(folded) == {"mfu_train": 8e9 / (4.0 * 2e10)}


def test_compare_shows_mfu_of_runs_that_logged_it(tmp_path: Path) -> None:
    logged = [metrics_row(s, 0.3, 1.0, mfu_rollout=0.01 * s, mfu_train=0.2) for s in (1, 2, 3)]
    runs = [write_run(tmp_path, "mfu", logged)]
    runs.append(write_run(tmp_path, "older", [metrics_row(s, 0.3, 1.0) for s in (1, 2, 3)]))
    console = recording_console()
    assert compare_runs(runs, out=tmp_path / "out", console=console) == 0
    row = next(line for line in console_text(console).splitlines() if "MFU rollout / train" in line)
    assert "2.00% / 20.00%" in row and "—" in row  # the older run logged none
