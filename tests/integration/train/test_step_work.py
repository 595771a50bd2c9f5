"""Work the RL step leaves out must not change the update: zero-advantage rows skipped,
length-bucketed micro-batches under a token budget (train/step/micro.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from gspo_cli.models import create_builtin
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.step.micro import bucket
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.rl_helpers import GROUP, PROMPTS, FixedRollout, GradCapturingEngine, tiny_step

# Prompts 0 and 2 are "solved" by every sample (a group with no signal); 1 and 3 vary.
ROWS = [{"prompt": "p", "answer": a} for a in ("all", "parity", "all", "parity")]


class HalfSolvedReward:
    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: Any = None,
        truncated: Any = None,
    ) -> RewardScores:
        # "parity" rows alternate 0 / 1 by position: their groups always carry a signal
        scores = [
            1.0 if r["answer"] == "all" else float(i % 2)
            for i, (c, r) in enumerate(zip(completions, rows, strict=True))
        ]
        return RewardScores(scores, scores, {})


class CountingEngine(GradCapturingEngine):
    """Also counts the rows scored and the (padded) tokens the backbone computes."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.rows = 0
        self.tokens = 0
        self.model.base_model.register_forward_hook(self._count_tokens)

    def _count_tokens(self, module: Any, args: Any, output: Any) -> None:
        self.tokens += output.last_hidden_state.shape[:2].numel()

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.rows += batch.input_ids.shape[0]
        return super().logprobs(batch, temperature, entropy)


def _rollout() -> FixedRollout:
    model, tokenizer = create_builtin("tiny-dense", seed=5)
    torch.manual_seed(5)
    params = SamplingParams(max_new_tokens=16, num_samples=GROUP)
    return FixedRollout(HFGenerateEngine(model, tokenizer).generate(PROMPTS, params))


def _norm_in_float64(
    norm: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor
) -> torch.Tensor:
    """Qwen3RMSNorm's output without its round trip through float32: transformers casts the
    norm's input to float32 (and autograd its gradient), so a float64 model still rounds its
    hidden states and gradients to float32 at every norm. Two runs whose float64 matmuls
    differ by 1e-16 then differ by float32 roundings: 1e-7 of a first step's gradient, up to
    5e-5 of the next one's once the first Adam update carried them into the weights.
    The same function, to float32 precision; float64 throughout."""
    assert isinstance(norm, Qwen3RMSNorm)
    (hidden,) = args
    variance = hidden.pow(2).mean(-1, keepdim=True)
    exact = norm.weight * (hidden * torch.rsqrt(variance + norm.variance_epsilon))
    torch.testing.assert_close(exact, output, rtol=1e-5, atol=1e-6)  # still the same norm
    return exact


def _run(  # type: ignore[no-untyped-def]
    algorithm: str, agg: str, minibatches: int, share_prompts: bool = True, **step: Any
):
    model, tokenizer = create_builtin("tiny-dense", seed=5)
    # float64: the fewer, narrower forwards must give the same update, which float32 rounding
    # (other matmul shapes, other summation orders) would blur at the 1e-6 level
    model.double()
    for module in model.modules():
        if isinstance(module, Qwen3RMSNorm):
            module.register_forward_hook(_norm_in_float64)
    recipe = Recipe.model_validate(
        {
            "algorithm": {"name": algorithm, "minibatches": minibatches, "loss_agg": agg},
            "optimizer": {"lr": 1e-3},
            "trainer": {"share_prompts": share_prompts},
        }
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=16, num_samples=GROUP)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer, **step)
    engine = CountingEngine(model, engine_settings(recipe), LOCAL)
    out = rl_step(StepModels(engine), ROLLOUT, HalfSolvedReward(), PROMPTS, ROWS, settings, 0)
    return engine, out.metrics, model


ROLLOUT = _rollout()
AGGREGATIONS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"]


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("algorithm", ["gspo", "gspo_token", "grpo"])
def test_skipping_zero_advantage_rows_leaves_the_gradient_unchanged(
    algorithm: str, agg: str
) -> None:
    full, full_metrics, _ = _run(algorithm, agg, 1, skip_zero_advantage=False)
    lean, lean_metrics, _ = _run(algorithm, agg, 1, skip_zero_advantage=True)
    assert _max_gap(full.grads[0], lean.grads[0]) < 1e-6
    assert max(float(g.abs().max()) for g in full.grads[0].values()) > 1e-3  # a real gradient
    assert full_metrics["zero_adv_skipped_frac"] == 0.0
    skipped = lean_metrics["zero_adv_skipped_frac"]
    assert skipped >= 0.5  # two of four groups carry no signal
    # pi_old and the training forward both left the skipped rows out
    assert lean.rows == pytest.approx(full.rows * (1 - skipped))
    assert lean_metrics["loss"] == pytest.approx(full_metrics["loss"], abs=1e-6)


@pytest.mark.parametrize("algorithm", ["gspo", "grpo"])
def test_clip_fractions_stay_shares_of_all_response_tokens(algorithm: str) -> None:
    _, full, _ = _run(algorithm, "seq_mean_token_mean", 4, skip_zero_advantage=False)
    _, lean, _ = _run(algorithm, "seq_mean_token_mean", 4, skip_zero_advantage=True)
    print(
        full["clip_frac"], lean["clip_frac"], full["zero_adv_seq_frac"], lean["zero_adv_seq_frac"]
    )
    assert full["clip_frac"] > 0
    assert lean["clip_frac"] == pytest.approx(full["clip_frac"], rel=1e-3)
    assert lean["zero_adv_seq_frac"] == pytest.approx(full["zero_adv_seq_frac"])


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_a_token_budget_leaves_the_gradient_unchanged_and_computes_less_padding(agg: str) -> None:
    # each prompt once: a budget that splits a prompt's rows would run it twice
    padded, _, _ = _run("grpo", agg, 2, False, skip_zero_advantage=False)
    budget, _, _ = _run(
        "grpo", agg, 2, False, skip_zero_advantage=False, max_tokens_per_micro_batch=60
    )
    assert budget.rows == padded.rows  # the same rows, in more, narrower micro-batches
    assert budget.tokens < padded.tokens
    assert _max_gap(padded.grads[0], budget.grads[0]) < 1e-6


def _assert_same_updates(expected: CountingEngine, actual: CountingEngine) -> None:
    """Every optimiser step's gradient, to 1e-9 of its largest entry: float64 rounding only
    (_norm_in_float64), measured at most 5e-13 on rollouts of seeds 5 to 8."""
    assert len(expected.grads) == len(actual.grads) > 0
    for wanted, got in zip(expected.grads, actual.grads, strict=True):
        assert wanted.keys() == got.keys()
        for key, grad in wanted.items():
            gap = float((got[key] - grad).abs().max())
            assert gap <= 1e-9 * float(grad.abs().max()), key


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("algorithm", ["gspo", "grpo"])
def test_running_each_prompt_once_leaves_the_update_unchanged(algorithm: str, agg: str) -> None:
    padded, padded_metrics, _ = _run(algorithm, agg, 2, share_prompts=False)
    shared, shared_metrics, _ = _run(algorithm, agg, 2, share_prompts=True)
    assert shared.rows == padded.rows
    # a prompt runs once per micro-batch, not once per response; the minibatches' rows of a
    # prompt stay together in the pi_old forward
    assert shared.tokens < padded.tokens
    _assert_same_updates(padded, shared)
    assert shared_metrics["loss"] == pytest.approx(padded_metrics["loss"], abs=1e-12)


def test_a_token_budget_with_shared_prompts_leaves_the_update_unchanged() -> None:
    padded, _, _ = _run("gspo", "seq_mean_token_mean", 2, False, skip_zero_advantage=False)
    budget, _, _ = _run(
        "gspo", "seq_mean_token_mean", 2, True, skip_zero_advantage=False,
        max_tokens_per_micro_batch=60,
    )  # fmt: skip
    assert budget.rows == padded.rows
    _assert_same_updates(padded, budget)


def test_a_step_without_signal_still_steps_the_optimiser_the_same_way() -> None:
    class Solved(HalfSolvedReward):
        def __call__(
            self,
            completions: list[str],
            rows: list[dict[str, Any]],
            completion_ids: Any = None,
            truncated: Any = None,
        ) -> RewardScores:
            return super().__call__(completions, [{"answer": "all"}] * len(rows))

    finals = []
    for skip in (False, True):
        model, tokenizer = create_builtin("tiny-dense", seed=5)
        recipe = Recipe.model_validate({"optimizer": {"lr": 1e-3, "weight_decay": 0.1}})
        params = SamplingParams(max_new_tokens=16, num_samples=GROUP)
        settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer, skip_zero_advantage=skip)
        engine = CountingEngine(model, engine_settings(recipe), LOCAL)
        out = rl_step(StepModels(engine), ROLLOUT, Solved(), PROMPTS, ROWS, settings, 0)
        finals.append((model.state_dict(), out.metrics, engine.rows))
    (full, _, full_rows), (lean, lean_metrics, lean_rows) = finals
    assert all(torch.equal(full[k], lean[k]) for k in full)  # weight decay alike, no gradient
    assert lean_metrics["zero_adv_skipped_frac"] == 1.0 and lean_rows < full_rows


def test_a_kl_term_keeps_every_row() -> None:
    recipe = Recipe.model_validate({"algorithm": {"kl_coef": 0.01}})
    settings = tiny_step(recipe)
    assert settings.skip_zero_advantage and not settings.skips_zero_advantage


def test_buckets_hold_every_row_once_within_the_caps() -> None:
    prompts = torch.tensor([5, 5, 9, 5, 5, 7, 5, 5])
    responses = torch.tensor([3, 30, 10, 2, 31, 4, 20, 1])
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    batches = bucket(rows, prompts, responses, max_rows=3, max_tokens=80)
    assert sorted(torch.cat(batches).tolist()) == rows.tolist()
    for b in batches:
        cost = len(b) * int(prompts[b].max() + responses[b].max())
        assert len(b) <= 3 and (cost <= 80 or len(b) == 1)
    assert batches[0].tolist()[0] == 4  # longest first: a memory peak shows at once
    assert [len(b) for b in bucket(rows, prompts, responses, 0, 0)] == [8]


def test_buckets_of_shared_prompts_count_each_prompt_once_and_keep_the_cheaper_order() -> None:
    # two prompts of 40 tokens, four rows each, responses of uneven lengths
    prompt_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    prompts = torch.full((8,), 40)
    responses = torch.tensor([9, 2, 8, 1, 10, 3, 7, 2])
    rows = torch.arange(8)
    batches = bucket(rows, prompts, responses, max_rows=4, max_tokens=0, prompts=prompt_ids)
    # longest first mixes the prompts in both micro-batches (2 x 40 + 4 x 10, 2 x 40 + 4 x 3):
    # prompt by prompt computes 40 + 4 x 9 and 40 + 4 x 10
    assert sorted(sorted(prompt_ids[b].tolist()) for b in batches) == [[0] * 4, [1] * 4]
    budget = bucket(rows, prompts, responses, max_rows=0, max_tokens=100, prompts=prompt_ids)
    assert sorted(torch.cat(budget).tolist()) == rows.tolist()
    for b in budget:
        cost = len(prompt_ids[b].unique()) * 40 + len(b) * int(responses[b].max())
        assert cost <= 100 or len(b) == 1
    # long responses of one prompt: padding to the group's longest costs more than the prompt
    long = torch.tensor([900, 10, 880, 12, 905, 11, 890, 9])
    mixed = bucket(rows, prompts, long, max_rows=4, max_tokens=0, prompts=prompt_ids)
    assert sorted(sorted(b.tolist()) for b in mixed) == [[0, 2, 4, 6], [1, 3, 5, 7]]
