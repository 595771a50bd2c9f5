"""KL in the reward, the entropy bonus and zero-advantage skipping in one RL step (tiny model,
float64, hand-built rollouts)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from gspo_cli.algorithms.advantages import group_advantages
from gspo_cli.algorithms.kl import kl_reward_penalty
from gspo_cli.core.errors import GspoError
from gspo_cli.models import create_builtin
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.runs.folder import TRAINER_STATE
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TorchEngine
from gspo_cli.train.run.reference import reference_state, refresh, restore_reference
from gspo_cli.train.step.rewards import RewardScores
from gspo_cli.train.step.train_batch import build_train_batch
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.rl_helpers import FixedRollout, GradCapturingEngine, tiny_step

GROUP = 4
PROMPTS = [[2, 10, 11, 12, 3, 6, 2], [2, 20, 21, 3, 6, 2], [2, 40, 3, 6, 2]]
# group 0: mixed rewards; group 1: equal rewards, different responses (KL breaks the tie);
# group 2: one response four times (equal rewards and equal KL: zero advantage either way)
COMPLETIONS = [
    [20, 21, 3], [22, 3], [23, 24, 25, 3], [26, 3],
    [30, 31, 3], [32, 3], [33, 34, 35, 3], [36, 37],
    [40, 41, 3], [40, 41, 3], [40, 41, 3], [40, 41, 3],
]  # fmt: skip
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


class FixedReward:
    """The given reward of each row, in order."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: Any = None,
        truncated: Any = None,
    ) -> RewardScores:
        return RewardScores(list(self.values), [float(v > 0) for v in self.values], {})


def _rollout() -> RolloutBatch:
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    texts = [str(i) for i in range(len(COMPLETIONS))]
    return RolloutBatch(prompts, COMPLETIONS, None, texts, [False] * len(COMPLETIONS))


def _run(
    algorithm: dict[str, Any], rewards: list[float], skip: bool = True, share: bool = True
) -> Any:
    """One step from the same float64 start; the reference is another seed's model."""
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    reference, _ = create_builtin("tiny-dense", seed=1)
    recipe = Recipe.model_validate(
        {
            "algorithm": {"name": "grpo", "minibatches": 1, **algorithm},
            "rollout": {"num_prompts": 3, "group_size": GROUP},
            "optimizer": {"lr": 1e-3},
            "trainer": {"share_prompts": share},
        }
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=8, num_samples=GROUP)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer, skip_zero_advantage=skip)
    engine = GradCapturingEngine(model.double(), engine_settings(recipe), LOCAL)
    ref = FrozenPolicy(reference.double().eval().requires_grad_(False))
    rows = [{"prompt": "p", "answer": "0"}] * len(PROMPTS)
    out = rl_step(
        StepModels(engine, ref), FixedRollout(_rollout()), FixedReward(rewards), PROMPTS, rows,
        settings, 0,
    )  # fmt: skip
    return out, engine, ref, settings


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        gap = float((a[name] - b[name]).abs().max())
        assert gap <= rtol * max(float(b[name].abs().max()), 1e-12), (name, gap)


def test_kl_in_the_reward_is_the_task_reward_minus_the_summed_kl() -> None:
    kl = {"kl_coef": 0.05, "kl_in": "reward", "kl_estimator": "k1"}
    out, engine, ref, _ = _run(kl, REWARDS)
    # by hand: pi_old (the start model) and the reference over the whole batch
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    batch = build_train_batch(_rollout(), int(tokenizer.pad_token_id))
    with torch.no_grad():
        old, _ = TorchEngine(model.double(), engine_settings(Recipe()), LOCAL).logprobs(batch, 1.0)
        ref_lp, _ = ref.logprobs(batch, 1.0)
    mask = batch.response_mask
    by_hand = [REWARDS[i] - 0.05 * float(((old[i] - ref_lp[i]) * mask[i]).sum()) for i in range(12)]
    penalty = kl_reward_penalty(old, ref_lp, mask, "k1", 0.05)
    assert float(penalty.abs().min()) > 1e-4  # the reference differs from the policy
    assert out.metrics["kl_reward_penalty"] == _approx(float(penalty.mean()))
    advantages = group_advantages(torch.tensor(by_hand, dtype=torch.float64), GROUP)
    assert out.metrics["advantage_abs_mean"] == _approx(float(advantages.abs().mean()))
    assert out.metrics["reward_mean"] == _approx(sum(REWARDS) / 12)  # the task reward is logged
    assert out.metrics["zero_adv_groups"] == 1.0  # only the group of identical responses
    # the same update as a step without KL whose rewards are the penalised ones
    _, plain, _, _ = _run({}, by_hand)
    _close(engine.grads[0], plain.grads[0], 1e-9)


def test_skipping_stays_exact_with_kl_in_the_reward() -> None:
    kl = {"kl_coef": 0.05, "kl_in": "reward", "kl_estimator": "low_var_kl"}
    skipped, engine_skip, _, settings = _run(kl, REWARDS, skip=True)
    assert settings.skips_zero_advantage
    assert skipped.metrics["zero_adv_skipped_frac"] == _approx(4 / 12)  # the identical group
    full, engine_full, _, _ = _run(kl, REWARDS, skip=False)
    assert full.metrics["zero_adv_skipped_frac"] == 0.0
    _close(engine_skip.grads[0], engine_full.grads[0], 1e-9)


def test_kl_in_the_loss_and_the_entropy_bonus_turn_skipping_off() -> None:
    for algorithm in ({"kl_coef": 0.05}, {"entropy_coef": 0.01}):
        out, _, _, settings = _run(algorithm, REWARDS, skip=True)
        assert not settings.skips_zero_advantage
        assert out.metrics["zero_adv_skipped_frac"] == 0.0


def test_the_entropy_bonus_gradient_is_autograds_of_minus_c_times_the_mean_entropy() -> None:
    c = 0.2
    # (each path's exact entropy gradient: tests/unit/models/test_entropy_grad.py)
    with_bonus, engine_on, _, _ = _run({"entropy_coef": c}, REWARDS, share=False)
    # without the bonus, nothing skipped either: the difference is the bonus's gradient alone
    _, engine_off, _, _ = _run({}, REWARDS, skip=False, share=False)
    model, tokenizer = create_builtin("tiny-dense", seed=0)
    model = model.double()
    batch = build_train_batch(_rollout(), int(tokenizer.pad_token_id))
    t = batch.response_mask.shape[1]
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    ).logits[:, -t - 1 : -1]  # [N, T, V]
    log_p = torch.log_softmax(logits, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)  # [N, T]
    mask = batch.response_mask.double()
    per_seq = (entropy * mask).sum(dim=1) / mask.sum(dim=1)  # seq-mean-token-mean
    bonus = -c * per_seq.mean()
    bonus.backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    got = {n: engine_on.grads[0][n] - engine_off.grads[0][n] for n in want}
    # RMSNorm computes in float32 even in a float64 model, and the step's micro-batches are
    # trimmed to other widths than this one batch: rounding, far below a wrong bonus's O(1)
    _close(got, want, 2e-5)  # type: ignore[arg-type]
    assert with_bonus.metrics["entropy_bonus"] > 0
    assert with_bonus.metrics["entropy_bonus"] == _approx(c * with_bonus.metrics["entropy"])


def test_the_reference_refreshes_every_n_steps_and_comes_back_from_checkpoints(
    tmp_path: Path,
) -> None:
    model, _ = create_builtin("tiny-dense", seed=0)
    engine = TorchEngine(model, engine_settings(Recipe()), LOCAL)
    ref = FrozenPolicy(copy.deepcopy(model).requires_grad_(False))

    def same() -> bool:
        return all(
            torch.equal(a, b)
            for a, b in zip(
                model.state_dict().values(), ref.model.state_dict().values(), strict=True
            )
        )

    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # an update
    assert not refresh(ref, 2, 1, engine) and not same()
    assert reference_state(ref, 2, 2) == {}  # a checkpoint of step 2 holds it as its weights
    assert refresh(ref, 2, 2, engine) and same()
    saved = reference_state(ref, 2, 3)  # step 3: the reference is step 2's policy
    torch.save(saved, tmp_path / TRAINER_STATE)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
        next(ref.model.parameters()).add_(5.0)  # the running job's reference is gone
    restore_reference(ref, 2, tmp_path, 3, engine)  # from the trainer state
    first = next(iter(saved["reference"]))
    assert torch.equal(ref.model.state_dict()[first], saved["reference"][first])
    assert not torch.equal(ref.model.state_dict()[first], model.state_dict()[first])
    restore_reference(ref, 2, tmp_path, 4, engine)  # a multiple of N: the policy itself
    assert same()
    with pytest.raises(GspoError, match="holds no KL reference weights"):
        torch.save({}, tmp_path / TRAINER_STATE)
        restore_reference(ref, 2, tmp_path, 5, engine)


def _approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-6, abs=1e-9)
