"""Tool tokens are context, never targets (shared/docs/multi-turn-and-teachers.md section 2):
every loss and aggregation on a tool trajectory equals the float64 loop over its model tokens
only, environment tokens change nothing, and `sequence_unit: turn` splits a trajectory into
its model turns."""

from __future__ import annotations

import pytest
import torch

from gspo_cli.algorithms import LossOptions, compute_policy_loss, loss_normalizer
from gspo_cli.algorithms.turns import split_turns
from gspo_cli.models.forward.batch import turn_ids
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.step.train_batch import build_train_batch, check_sampled_ids
from tests.support.loss_cases import AGGS, CASES, CLIPS, sequence_advantages, tool_batch
from tests.support.loss_reference import TAUS, reference_loss

Tensor = torch.Tensor


def loss_and_grad(
    lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, algo: str, agg: str,
    turns: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:  # fmt: skip
    x = lp.detach().clone().requires_grad_(True)
    low, high = CLIPS[algo]
    loss, metrics = compute_policy_loss(
        x, old, adv, mask, algorithm=algo, clip_low=low, clip_high=high, loss_agg=agg,
        options=LossOptions(*TAUS), turns=turns,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, x)
    return loss, grad, metrics


@pytest.mark.parametrize("algo,agg", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_on_a_tool_trajectory_is_the_loop_over_its_model_tokens(
    algo: str, agg: str, seed: int
) -> None:
    lp, old, adv, mask = tool_batch(seed)
    adv = sequence_advantages(adv, mask, algo)
    loss, grad, _ = loss_and_grad(lp, old, adv, mask, algo, agg)
    lp_ref = lp.detach().clone().requires_grad_(True)
    ref = reference_loss(lp_ref, old, adv, mask, algo, *CLIPS[algo], agg)
    (grad_ref,) = torch.autograd.grad(ref, lp_ref)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)
    assert (grad[mask == 0] == 0).all()  # a tool token is never a target


@pytest.mark.parametrize("algo,agg", CASES)
@pytest.mark.parametrize("value", [0.0, 1.0, -1e4])
def test_a_tool_tokens_log_probs_change_nothing(algo: str, agg: str, value: float) -> None:
    lp, old, adv, mask = tool_batch(3)
    adv = sequence_advantages(adv, mask, algo)
    base = loss_and_grad(lp, old, adv, mask, algo, agg)
    tool = mask == 0
    moved_old = torch.where(tool, torch.full_like(old, value), old)
    moved_lp = torch.where(tool, torch.full_like(old, value), lp.detach())
    moved = loss_and_grad(moved_lp, moved_old, adv, mask, algo, agg)
    assert torch.equal(base[0], moved[0]) and torch.equal(base[1], moved[1])
    assert base[2] == moved[2]  # every metric: clip fractions, ratios, zero-advantage shares


def per_turn_rows(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
    """The same batch with one row per model turn, built by a plain loop."""
    rows, masks = [], []
    for i in range(mask.shape[0]):
        run: list[int] = []
        for t in range(mask.shape[1] + 1):
            if t < mask.shape[1] and mask[i, t] > 0:
                run.append(t)
            elif run:
                one = torch.zeros(mask.shape[1], dtype=mask.dtype)
                one[run] = 1
                rows.append(i)
                masks.append(one)
                run = []
    index = torch.tensor(rows)
    return lp[index], old[index], adv[index], torch.stack(masks)


@pytest.mark.parametrize("algo,agg", CASES)
def test_sequence_unit_turn_makes_each_model_turn_a_sequence(algo: str, agg: str) -> None:
    lp, old, adv, mask = tool_batch(5)
    adv = sequence_advantages(adv, mask, algo)  # the trajectory's advantage on every turn
    loss, grad, _ = loss_and_grad(lp, old, adv, mask, algo, agg, turns=turn_ids(mask))
    lp_ref = lp.detach().clone().requires_grad_(True)
    ref = reference_loss(*per_turn_rows(lp_ref, old, adv, mask), algo, *CLIPS[algo], agg)
    (grad_ref,) = torch.autograd.grad(ref, lp_ref)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)
    turns = per_turn_rows(lp, old, adv, mask)[3].shape[0]
    assert turns > mask.shape[0]  # the batch really has several turns per trajectory
    assert loss_normalizer(mask, "seq_mean_token_mean", turn_ids(mask)) == turns


def test_without_tool_tokens_turn_and_trajectory_are_the_same() -> None:
    lp, old, adv, _ = tool_batch(7)
    mask = torch.zeros_like(old)
    mask[:, 2:15] = 1  # one model turn per row
    one = loss_and_grad(lp, old, adv, mask, "gspo", AGGS[0])
    turned = loss_and_grad(lp, old, adv, mask, "gspo", AGGS[0], turns=turn_ids(mask))
    torch.testing.assert_close(one[0], turned[0], rtol=0, atol=0)
    torch.testing.assert_close(one[1], turned[1], rtol=0, atol=0)


def test_turn_ids_and_split_turns() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [1, 0, 1, 0, 1, 1, 1]], dtype=torch.float32)
    ids = turn_ids(mask)
    assert ids.tolist() == [[-1, 0, 0, -1, -1, 1, -1], [0, -1, 1, -1, 2, 2, 2]]
    rows, masks = split_turns(ids, mask)
    assert sorted(rows.tolist()) == [0, 0, 1, 1, 1]
    assert torch.equal(masks.sum(0), mask.sum(0))  # every model token in exactly one turn


def rollout_with_tools() -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=[[5, 6], [7]],
        completion_ids=[[10, 11, 90, 91, 12, 2], [13, 2]],
        completion_logprobs=None,
        texts=["", ""],
        truncated=[False, False],
        from_tool=[[False, False, True, True, False, False], [False, False]],
    )


def test_the_train_batch_masks_tool_tokens_and_keeps_the_engines_ids() -> None:
    rollout = rollout_with_tools()
    batch = build_train_batch(rollout, pad_id=0)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]]
    assert batch.attention_mask[:, batch.prompt_width :].sum(1).tolist() == [6, 2]
    check_sampled_ids(batch, rollout)  # passes
    trimmed = batch.select(torch.tensor([1])).trimmed()
    assert trimmed.response_mask.shape[1] == 2  # trimming sees tool tokens as response too


def test_the_trainer_refuses_ids_other_than_the_engines() -> None:
    rollout = rollout_with_tools()
    batch = build_train_batch(rollout, pad_id=0)
    rollout.completion_ids[0][2] = 99  # a re-tokenised tool result, say
    with pytest.raises(AssertionError, match="differ from the engine"):
        check_sampled_ids(batch, rollout)
    rollout = rollout_with_tools()
    assert rollout.from_tool is not None
    rollout.from_tool[0][4] = True  # a target where the engine says the tool wrote it
    with pytest.raises(AssertionError, match="sources"):
        check_sampled_ids(batch, rollout)
