"""Rollout engines: the registry, HF log-probs gathered step by step, mismatch and corrections."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.models import create_builtin
from gspo_cli.models.forward.batch import pad_logprobs
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.recipe import Recipe, RecipeError, load_recipe
from gspo_cli.rollout.base import EngineSpec, SamplingParams
from gspo_cli.rollout.engines import make_rollout_engine
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.step.train_batch import build_train_batch
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.rl_helpers import PROMPTS, LengthParityReward, tiny_step


def _gap(model, tokenizer, rollout, temperature: float) -> float:  # type: ignore[no-untyped-def]
    batch = build_train_batch(rollout, int(tokenizer.pad_token_id))
    with torch.no_grad():
        trainer, _ = response_logprobs(model, batch, temperature)
    engine = pad_logprobs(rollout.completion_logprobs, batch.response_mask.shape[1])
    return float(((trainer - engine).abs() * batch.response_mask).max())


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.0, 1.0, 0)])
def test_hf_engine_logprobs_equal_the_trainers(
    temperature: float, top_p: float, top_k: int
) -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=1)
    engine = HFGenerateEngine(model, tokenizer)
    torch.manual_seed(0)
    rollout = engine.generate(PROMPTS, SamplingParams(temperature, top_p, top_k, 12, 3, True))
    assert _gap(model, tokenizer, rollout, temperature) < 1e-5
    plain = engine.generate(PROMPTS, SamplingParams(temperature, top_p, top_k, 12, 3))
    assert plain.completion_logprobs is None  # not asked for: no logits kept at all


def test_checkpoint_sampling_knobs_are_set_aside(caplog: pytest.LogCaptureFixture) -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=2)
    engine = HFGenerateEngine(model, tokenizer)
    params = SamplingParams(1.0, 1.0, 0, 12, 2)
    clean = engine.generate(PROMPTS, params, seeds=[1, 2, 3, 4])
    model.generation_config.repetition_penalty = 5.0  # would change every sample
    model.generation_config.no_repeat_ngram_size = 2
    with caplog.at_level(logging.WARNING):
        again = HFGenerateEngine(model, tokenizer).generate(PROMPTS, params, seeds=[1, 2, 3, 4])
    assert again.completion_ids == clean.completion_ids
    assert "repetition_penalty=5.0" in caplog.text and "no_repeat_ngram_size=2" in caplog.text
    assert model.generation_config.repetition_penalty == 5.0  # the model's own config is kept


def test_unknown_engines_are_recipe_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.yaml"
    path.write_text("rollout:\n  engine: sglang\n")
    with pytest.raises(RecipeError, match="unknown rollout engine 'sglang'; known: hf, vllm"):
        load_recipe(path)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_missing_is_one_clear_error() -> None:
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    spec = EngineSpec(model, tokenizer, model.state_dict().items)
    with pytest.raises(GspoError, match=r"vllm is not installed.*\[vllm\]"):
        make_rollout_engine("vllm", spec)


@pytest.mark.parametrize(
    "rollout,algorithm,message",
    [
        ({"use_engine_logprobs": True}, {"rollout_correction": "token_tis"}, "one or the other"),
        ({"use_engine_logprobs": True, "top_p": 0.9}, {}, "need top_p 1, top_k 0"),
        ({}, {"rollout_correction": "seq_mean"}, "unknown rollout correction 'seq_mean'"),
        ({}, {"rollout_correction": "icepop", "correction_band": [2, 5]}, "0 < alpha <= 1"),
        ({}, {"rollout_correction": "icepop", "correction_band": [0, 5]}, "0 < alpha <= 1"),
        ({}, {"rollout_correction": "token_tis", "correction_band": [0.5, 5]}, "icepop's band"),
    ],
)
def test_engine_logprob_settings_are_checked(rollout, algorithm, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        Recipe.model_validate({"rollout": rollout, "algorithm": algorithm})


class _PerturbedEngine(HFGenerateEngine):
    """The trainer's own sampler, its log-probs off by -2 on every 4th token (k = e^2 > 5)."""

    def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().generate(*args, **kwargs)
        for lp in out.completion_logprobs or []:
            lp[::4] -= 2.0
        return out


def _step(use_engine_logprobs: bool, correction: str, perturbed: bool = False):  # type: ignore[no-untyped-def]
    model, tokenizer = create_builtin("tiny-dense", seed=3)
    recipe = Recipe.model_validate(
        {
            "algorithm": {"name": "gspo", "minibatches": 2, "rollout_correction": correction},
            "rollout": {"use_engine_logprobs": use_engine_logprobs},
        }
    )
    params = SamplingParams(1.0, 1.0, 0, 12, 4, logprobs=True)
    settings = tiny_step(recipe, sampling=params, use_engine_logprobs=use_engine_logprobs)
    torch.manual_seed(0)
    rows = [{"prompt": "p", "answer": "0"}] * len(PROMPTS)
    engine = TorchEngine(model, engine_settings(recipe), LOCAL)
    rollout = (_PerturbedEngine if perturbed else HFGenerateEngine)(model, tokenizer)
    return rl_step(
        StepModels(engine), rollout, LengthParityReward(), PROMPTS, rows, settings, 0
    ).metrics


@pytest.mark.parametrize("use_engine_logprobs", [False, True])
def test_mismatch_is_measured_whenever_engine_logprobs_exist(use_engine_logprobs: bool) -> None:
    metrics = _step(use_engine_logprobs, "off")
    # The HF engine samples from the trainer's own weights: the gap is float noise only.
    assert metrics["mismatch_token_abs_mean"] < 1e-5
    assert metrics["mismatch_token_abs_max"] < 1e-4
    assert metrics["mismatch_outside_clip_frac"] == 0.0


@pytest.mark.parametrize("correction", ["token_tis", "seq_mask", "seq_truncate", "icepop"])
def test_corrections_report_their_effect(correction: str) -> None:
    metrics = _step(False, correction)
    assert metrics["correction_masked_token_frac"] == 0.0  # no mismatch: nothing masked
    assert metrics["correction_weight_mean"] == pytest.approx(1.0, abs=1e-4)


def test_icepop_masks_the_tokens_the_engine_disagrees_on() -> None:
    metrics = _step(False, "icepop", perturbed=True)
    # every 4th token of each response (the first included) leaves the band [0.5, 5]
    assert 0.25 <= metrics["correction_masked_token_frac"] <= 0.5
    assert metrics["mismatch_token_abs_max"] == pytest.approx(2.0, abs=1e-4)


def test_a_hung_engine_call_ends_the_run_with_one_line_and_exit_2() -> None:
    import subprocess
    import sys

    code = (
        "import time\nfrom gspo_cli.rollout.vllm import deadline\n"
        "with deadline(0.5, 'generate'):\n    time.sleep(30)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "vLLM generate did not finish within" in result.stderr
