"""The real pretrained model (`builtin:smollm2-135m`, SmolLM2-135M-Instruct from a GGUF in a PyPI
wheel): loading it, its chat format, and the trainer's exactness on a 49,152-token vocabulary and
a tied-embedding Llama. Short responses and few rows: it is 134.5M parameters on a 2-core CPU."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gspo_cli.data.prompts import render_prompt
from gspo_cli.models.forward.capabilities import capabilities_of, plain_linear_head
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.models.gguf import hf_folder_of, wheel_gguf
from gspo_cli.models.loading import hf_path, load_policy
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.step.train_batch import build_train_batch

pytestmark = pytest.mark.slow

SMOLLM2 = "builtin:smollm2-135m"
QUESTIONS = ["What is 3 + 4?", "Name a colour.", "What is 12 - 5? Answer with a number."]


@pytest.fixture(scope="module")
def smollm2() -> Iterator[tuple[Any, Any]]:
    model, tokenizer = load_policy(SMOLLM2)
    yield model.eval(), tokenizer


def test_the_wheel_holds_a_tied_chatml_llama(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=1e-3)
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert getattr(model.config, "quantization_config", None) is None  # a plain fp32 model
    text = tokenizer.decode(render_prompt(tokenizer, "What is 3 + 4?"))
    # ChatML with SmolLM's default system turn, ending in an open assistant turn
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n")
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]  # TRL's conversational prompt: its own system turn replaces SmolLM's default
    text = tokenizer.decode(render_prompt(tokenizer, conversation))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_gguf_path_loads_through_the_same_cached_folder(tmp_path: Path) -> None:
    folder = Path(hf_path(SMOLLM2))
    copy = tmp_path / "my-model.gguf"
    copy.symlink_to(wheel_gguf("smollm2-135m"))
    assert Path(hf_path(str(copy))) == folder  # keyed by content, not by name
    assert hf_folder_of(copy, what="model.path") == folder
    config = (folder / "config.json").read_text(encoding="utf-8")
    assert '"quantization_config"' not in config and '"tie_word_embeddings": true' in config


def test_responses_stop_at_im_end(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    prompts = [render_prompt(tokenizer, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_new_tokens=48, num_samples=1)
    batch = HFGenerateEngine(model, tokenizer).generate(prompts, params)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    finished = [ids for ids in batch.completion_ids if eos in ids]
    assert finished, "no response ended its turn within 48 tokens"
    for ids in finished:
        assert ids.index(eos) == len(ids) - 1  # nothing after the end of the turn
    assert any("7" in tokenizer.decode(ids) for ids in batch.completion_ids[:1])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_trainer_scores_the_rollout_as_it_was_sampled(
    smollm2: tuple[Any, Any], temperature: float
) -> None:
    """The trainer's log-prob of every sampled token (hand-written head over all 49,152 tokens,
    each prompt run once) equals the one the rollout engine sampled it with: to rounding in
    float64; in float32 the length-normalised sequence log-ratio GSPO clips stays within 2e-5
    (single tokens differ by up to ~3e-5: a cached decoding step and a full forward round
    differently)."""
    model, tokenizer = smollm2
    prompts = [render_prompt(tokenizer, q) for q in QUESTIONS[:2]]
    params = SamplingParams(temperature, max_new_tokens=24, num_samples=3, logprobs=True)
    for dtype, token_bound, sequence_bound in (
        (torch.float64, 1e-10, 1e-10),
        (torch.float32, 1e-4, 2e-5),
    ):
        model.to(dtype)
        torch.manual_seed(3)
        rollout = HFGenerateEngine(model, tokenizer).generate(prompts, params)
        batch = build_train_batch(rollout, tokenizer.pad_token_id)
        caps = capabilities_of(model, share_prompts=True)
        assert caps.plain_head and caps.shares_prompts_at(batch.input_ids.shape[1])
        with torch.no_grad():
            trainer, _ = response_logprobs(model, batch, temperature, False, caps)
        sampled = rollout.completion_logprobs
        assert sampled is not None
        gaps = [trainer[i, : len(row)].double() - row.double() for i, row in enumerate(sampled)]
        token_gap = max(float(g.abs().max()) for g in gaps)
        sequence_gap = max(abs(float(g.mean())) for g in gaps)
        print(f"{dtype} T={temperature}: token gap {token_gap:.2e}, sequence {sequence_gap:.2e}")
        assert token_gap <= token_bound and sequence_gap <= sequence_bound
    model.to(torch.float32)


def test_the_shared_head_gives_the_models_own_gradient_on_a_tied_llama(
    smollm2: tuple[Any, Any],
) -> None:
    """Shared prompts and the hand-written LM head against the model's own padded forward and
    autograd, in float64, tied embeddings included (their gradient sums head and input)."""
    model, tokenizer = smollm2
    model64 = model.to(torch.float64).train()
    try:
        prompts = [render_prompt(tokenizer, q) for q in QUESTIONS[:2]]
        params = SamplingParams(1.0, max_new_tokens=8, num_samples=2)
        torch.manual_seed(4)
        batch = build_train_batch(
            HFGenerateEngine(model64, tokenizer).generate(prompts, params),
            tokenizer.pad_token_id,
        )
        assert plain_linear_head(model64) is model64.lm_head
        fast = capabilities_of(model64, share_prompts=True)
        plain = dataclasses.replace(fast, plain_head=False, shares_prompts=False)
        results = []
        for caps in (fast, plain):
            model64.zero_grad()
            logprobs, _ = response_logprobs(model64, batch, 1.0, False, caps)
            (logprobs * batch.response_mask.to(logprobs)).sum().backward()
            grad = model64.lm_head.weight.grad  # the tied embedding: head and input both
            results.append((logprobs.detach() * batch.response_mask.to(logprobs), grad.clone()))
        (fast_lp, fast_grad), (own_lp, own_grad) = results
        assert float((fast_lp - own_lp).abs().max()) < 1e-10
        # Llama's RMSNorm computes in float32 even in a float64 model, and the two paths sum a
        # shared prompt's gradient in a different order: float32 rounding of the largest entry
        assert float((fast_grad - own_grad).abs().max()) < 1e-6 * float(own_grad.abs().max())
    finally:
        model.to(torch.float32).eval().zero_grad(set_to_none=True)


# The model as shipped never boxes an answer (the maths reward is 0 everywhere): a reward with
# signal from the first step.
PARITY = """
def parity(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]
"""


def test_a_lora_run_on_the_real_model_trains_adapters_and_evaluates(
    tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two GSPO steps of rank-4 LoRA on SmolLM2 (short responses), then `gspo eval` of the run:
    base + adapters, with the base rebuilt from its GGUF rather than copied into the run."""
    from safetensors.torch import load_file

    from tests.support.helpers import invoke_cli, write_recipe

    recipe = write_recipe(
        tmp_path,
        {
            "model": {"path": SMOLLM2, "lora": {"r": 4, "alpha": 8}},
            "reward": {"functions": [{"name": "smollm2_rewards:parity"}]},
            "rollout": {"num_prompts": 2, "group_size": 4, "max_new_tokens": 12},
            "eval": {"num_problems": 4, "samples": 1, "every": 100},
            "optimizer": {"lr": 1e-3},
            "trainer": {"steps": 2, "checkpoint_every": 2},
        },
    )
    (tmp_path / "smollm2_rewards.py").write_text(PARITY)
    monkeypatch.chdir(tmp_path)  # the reward module is importable from here
    run = tmp_path / "run"
    result = invoke_cli("train", str(recipe), "--out", str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    share = [line for line in result.stdout.splitlines() if line.startswith("lora: r 4")]
    assert share and "of 135,736,128 parameters" in share[0]  # 134.5M base + 1.2M adapters
    (checkpoint,) = (run / "checkpoints").glob("step_*")
    adapter = json.loads((checkpoint / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == SMOLLM2
    assert not (run / "lora_base").exists()  # no 538 MB copy of the base
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    assert weights and all("lora_" in name for name in weights)
    assert any(float(w.abs().max()) > 0 for n, w in weights.items() if "lora_B" in n)  # trained
    gsm8k = str(shared / "benchmarks" / "gsm8k")
    evaluated = invoke_cli(
        "eval", str(run), "--benchmark", "gsm8k", "--data", gsm8k, "--limit", "2",
        "--samples", "1", "--max-new-tokens", "8", "--out", str(tmp_path / "eval"),
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads((tmp_path / "eval" / "results.json").read_text())


def test_a_lora_target_the_real_model_lacks_is_one_line_at_validate(tmp_path: Path) -> None:
    from tests.support.helpers import invoke_cli, write_recipe

    recipe = write_recipe(
        tmp_path, {"model": {"path": SMOLLM2, "lora": {"r": 4, "target_modules": ["c_attn"]}}}
    )
    result = invoke_cli("validate", str(recipe))
    assert result.returncode == 2
    assert "builtin:smollm2-135m has no module 'c_attn'; its linear modules are q_proj" in (
        result.stderr
    )
