"""pi_old from the rollout engine's log-probs (`rollout.use_engine_logprobs`, step/old_policy.py):
the update equals the recompute's, `auto` falls back when the gap is too wide, and says so."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from gspo_cli.models import create_builtin
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.run.guard import Guard
from gspo_cli.train.step.old_policy import gap_limit, resolve_engine_logprobs
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.rl_helpers import tiny_step

PROMPTS = [[2, 10, 11, 12, 3, 6, 2], [2, 20, 21, 3, 6, 2], [2, 30, 31, 32, 33, 3, 6, 2]]
GROUP = 4
ROWS = [{"prompt": "p", "answer": "0"}] * len(PROMPTS)


class ParityReward:
    """Varies within every group, so every row carries a signal."""

    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: Any = None,
        truncated: Any = None,
    ) -> RewardScores:
        scores = [float(i % 2) for i in range(len(completions))]
        return RewardScores(scores, scores, {})


class Replay:
    """Hands out one fixed rollout, so that set-ups under comparison see identical data."""

    def __init__(self, batch: RolloutBatch) -> None:
        self.batch = batch

    def sync_weights(self) -> None:
        pass

    def generate(self, *_: Any, **__: Any) -> RolloutBatch:
        return self.batch


class RecordingEngine(TorchEngine):
    """Records each optimiser step's gradients and how many rows every forward took."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.grads: list[dict[str, torch.Tensor]] = []
        self.rows = 0

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.rows += batch.input_ids.shape[0]
        return super().logprobs(batch, temperature, entropy)

    def step(self, skip: bool = False) -> tuple[float, bool]:
        self.grads.append({n: p.grad.clone() for n, p in self.model.named_parameters()})
        return super().step(skip)


def _model(dtype: torch.dtype):  # type: ignore[no-untyped-def]
    model, tokenizer = create_builtin("tiny-dense", seed=7)
    return model.to(dtype), tokenizer


def _rollout(dtype: torch.dtype, temperature: float) -> RolloutBatch:
    model, tokenizer = _model(dtype)
    torch.manual_seed(7)
    params = SamplingParams(temperature, max_new_tokens=12, num_samples=GROUP, logprobs=True)
    return HFGenerateEngine(model, tokenizer).generate(PROMPTS, params)


def _step(mode: bool | str, rollout: RolloutBatch, dtype: torch.dtype, temperature: float = 1.0):  # type: ignore[no-untyped-def]
    model, tokenizer = _model(dtype)
    recipe = Recipe.model_validate(
        {"algorithm": {"name": "gspo", "minibatches": 2}, "optimizer": {"lr": 1e-3}}
    )
    params = SamplingParams(temperature, max_new_tokens=12, num_samples=GROUP, logprobs=True)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer, use_engine_logprobs=mode)
    engine = RecordingEngine(model, engine_settings(recipe), LOCAL)
    out = rl_step(StepModels(engine), Replay(rollout), ParityReward(), PROMPTS, ROWS, settings, 0)
    return engine, out.metrics


def _max_gap(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> float:
    return max(float((x[k] - y[k]).abs().max()) for x, y in zip(a, b, strict=True) for k in x)


@pytest.mark.parametrize("mode", [True, "auto"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_in_float64_the_engines_logprobs_give_the_recomputed_update(
    mode: bool | str, temperature: float
) -> None:
    rollout = _rollout(torch.float64, temperature)
    recomputed, base = _step(False, rollout, torch.float64, temperature)
    engine, metrics = _step(mode, rollout, torch.float64, temperature)
    assert metrics["pi_old_from_engine"] == 1.0 and base["pi_old_from_engine"] == 0.0
    assert len(engine.grads) == 2  # the second minibatch's ratio really reads pi_old
    assert max(float(g.abs().max()) for g in recomputed.grads[1].values()) > 1e-3
    assert _max_gap(recomputed.grads, engine.grads) < 1e-10
    assert metrics["loss"] == pytest.approx(base["loss"], abs=1e-10)
    # the recompute ran over every trained row; `auto` checked on its first training forward
    assert recomputed.rows - engine.rows == len(PROMPTS) * GROUP
    if mode == "auto":
        assert metrics["engine_gap_seq_max"] < 1e-12  # float64: the two agree to rounding


def test_auto_recomputes_when_the_gap_is_too_wide_and_says_so() -> None:
    rollout = _rollout(torch.float32, 1.0)
    # an engine whose log-probs sit 1e-3 per token below the trainer's: a sequence log-ratio
    # of 1e-3, far past a tenth of log(1 + 4e-4)
    shifted = [row - 1e-3 for row in rollout.completion_logprobs or []]
    skewed = dataclasses.replace(rollout, completion_logprobs=shifted)
    recomputed, _ = _step(False, skewed, torch.float32)
    engine, metrics = _step("auto", skewed, torch.float32)
    assert metrics["pi_old_from_engine"] == 0.0
    assert metrics["engine_gap_seq_max"] == pytest.approx(1e-3, rel=0.05)
    assert metrics["engine_gap_limit"] == pytest.approx(0.1 * math.log1p(4e-4))
    assert _max_gap(recomputed.grads, engine.grads) < 1e-6  # the recompute's update
    guard = Guard(max_bad_updates=3, on_collapse="warn", max_rollbacks=0)
    lines = guard.notices(1, metrics)
    assert len(lines) == 1 and "pi_old is recomputed" in lines[0]
    assert guard.notices(2, metrics) == []  # said once while it lasts
    trusted = {**metrics, "engine_gap_seq_max": 1e-7, "pi_old_from_engine": 1.0}
    assert any("engine's log-probs again" in line for line in guard.notices(3, trusted))


def test_the_first_ratio_note_names_the_engine_gap_instead_of_sampling_processors() -> None:
    guard = Guard(max_bad_updates=3, on_collapse="warn", max_rollbacks=0)
    metrics = {"first_ratio_gap_max": 3e-5, "pi_old_from_engine": 1.0}
    lines = guard.notices(1, metrics)
    assert len(lines) == 1 and "engine-vs-trainer gap" in lines[0]
    assert "sampling processors" not in lines[0]
    recompute = Guard(max_bad_updates=3, on_collapse="warn", max_rollbacks=0)
    assert "sampling processors" in recompute.notices(1, {"first_ratio_gap_max": 3e-5})[0]


@pytest.mark.parametrize(
    "algorithm,settings,expected",
    [
        ("gspo", {}, "auto"),
        ("gspo_token", {}, False),  # a per-token ratio: the trainer's own pi_old
        ("grpo", {}, False),
        ("gspo", {"top_p": 0.9}, False),  # renormalised log-probs are not pi_old's
        ("gspo", {"top_k": 5}, False),
        ("gspo", {"rollout_correction": "token_tis"}, False),
        ("gspo", {"routing_replay": "old_policy"}, False),
    ],
)
def test_auto_resolves_to_the_engine_only_where_it_is_sound(
    algorithm: str, settings: dict[str, Any], expected: bool | str
) -> None:
    options = {"top_p": 1.0, "top_k": 0, "rollout_correction": "off", "routing_replay": "off"}
    options.update(settings)
    resolved = resolve_engine_logprobs("auto", algorithm=algorithm, **options)  # type: ignore[arg-type]
    assert resolved == expected
    for explicit in (True, False):  # explicit settings keep their meaning
        assert resolve_engine_logprobs(explicit, algorithm=algorithm, **options) is explicit  # type: ignore[arg-type]


def test_auto_is_the_default_and_true_stays_checked() -> None:
    assert Recipe.model_validate({}).rollout.use_engine_logprobs == "auto"
    assert gap_limit(4e-4) == pytest.approx(4e-5, rel=1e-3)
    # auto with top-p is fine (it recomputes); true with top-p is refused
    Recipe.model_validate({"rollout": {"top_p": 0.9}})
    with pytest.raises(ValueError, match="need top_p 1, top_k 0"):
        Recipe.model_validate({"rollout": {"top_p": 0.9, "use_engine_logprobs": True}})
