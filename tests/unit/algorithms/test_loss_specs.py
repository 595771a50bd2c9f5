"""Each loss's `LossSpec` (gspo_cli/algorithms/losses/): the papers' values every registered spec
carries, and the recipe's and the step's choices taken from the specs alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gspo_cli.algorithms import LOSS_SPECS, LossSpec, compute_policy_loss, resolve_loss_agg
from gspo_cli.core.registry import UnknownNameError
from gspo_cli.recipe import RecipeError, load_recipe

SMTM = "seq_mean_token_mean"
# Written from the papers (docs/options/successor-losses.md for the successors): name ->
# (clip range, paper's aggregation, aggregations allowed (None: any), sequence ratio, hard clip).
# A loss registered without a row here fails the first test.
PAPERS: dict[str, tuple[tuple[float, float], str, set[str] | None, bool, bool]] = {
    "gspo": ((3e-4, 4e-4), SMTM, None, True, True),  # GSPO section 5.1
    "gspo_token": ((3e-4, 4e-4), SMTM, None, False, True),
    "grpo": ((0.2, 0.27), SMTM, None, False, True),  # DAPO's clip-higher
    "luspo": ((2e-3, 2.5e-3), SMTM, {SMTM}, True, True),  # section 4
    "sapo": ((0.2, 0.2), SMTM, None, False, False),  # a soft gate: the pair is unused
    "gmpo": ((0.4, 0.4), SMTM, None, False, True),  # Table 5, in log space
    "cispo": ((1.0, 0.2), "token_mean", None, False, True),  # Eq. 4; no lower bound
    # DPPO: the paper's run's deltas (verl examples/dppo_trainer); prime-rl's token mean
    "dppo_tv": ((0.15, 0.15), "token_mean", None, False, True),
    "dppo_kl": ((0.05, 0.05), "token_mean", None, False, True),
    # VESPO: a kernel, no clip; TRL's and the authors' token mean, no length normalisation
    "vespo": ((0.2, 0.2), "token_mean", {"token_mean"}, False, False),
}
THROWAWAY = "test_only_loss"  # registered by one test below, then removed


def test_every_registered_spec_carries_its_papers_values() -> None:
    found = {
        name: (s.paper_clip, s.paper_loss_agg, s.loss_aggs, s.sequence_ratio, s.hard_clip)
        for name, s in ((name, LOSS_SPECS.get(name)) for name in LOSS_SPECS)
    }
    assert found == PAPERS


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_a_recipe_that_leaves_them_unset_gets_the_papers_clip_and_aggregation(
    name: str, tmp_path: Path
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(f"algorithm: {{name: {name}}}\n")
    algo = load_recipe(path).algorithm
    clip, agg = PAPERS[name][:2]
    assert (algo.clip_low, algo.clip_high) == clip
    assert algo.loss_agg == agg == resolve_loss_agg(name, None)


@pytest.fixture
def throwaway() -> Iterator[LossSpec]:
    """A spec registered for one test (GRPO's loss with values of its own), then removed."""
    spec = LossSpec(
        LOSS_SPECS.get("grpo").loss,
        (0.125, 0.375),
        paper_loss_agg="token_mean",
        loss_aggs=frozenset({"token_mean", "seq_mean_token_sum"}),
        sequence_ratio=True,
    )
    LOSS_SPECS.add(THROWAWAY, spec)
    try:
        yield spec
    finally:
        LOSS_SPECS.remove(THROWAWAY)
    assert THROWAWAY not in LOSS_SPECS


def _recipe(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return load_recipe(path)


def test_an_unregistered_name_is_no_recipe_choice(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, f"algorithm: {{name: {THROWAWAY}}}\n")
    assert any(f"unknown algorithm '{THROWAWAY}'" in p for p in info.value.problems)
    with pytest.raises(UnknownNameError):
        resolve_loss_agg(THROWAWAY, None)


def test_a_spec_registered_here_is_a_recipe_choice_with_its_values(
    throwaway: LossSpec, tmp_path: Path
) -> None:
    algo = _recipe(tmp_path, f"algorithm: {{name: {THROWAWAY}}}\n").algorithm
    assert (algo.clip_low, algo.clip_high, algo.loss_agg) == (0.125, 0.375, "token_mean")
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, f"algorithm: {{name: {THROWAWAY}, loss_agg: {SMTM}}}\n")
    refused = f"{THROWAWAY} supports loss_agg seq_mean_token_sum or token_mean only, not {SMTM}"
    assert any(refused in p for p in info.value.problems), info.value.problems


def test_the_step_and_the_loss_ask_the_spec(throwaway: LossSpec) -> None:
    from gspo_cli.train.step.old_policy import resolve_engine_logprobs

    exact = {"top_p": 1.0, "top_k": 0, "rollout_correction": "off", "routing_replay": "off"}
    assert resolve_engine_logprobs("auto", algorithm=THROWAWAY, **exact) == "auto"  # type: ignore[arg-type]
    assert resolve_engine_logprobs("auto", algorithm="grpo", **exact) is False  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    lp = old + 0.3 * torch.randn(3, 5, generator=g)
    adv, mask = torch.randn(3, 5, generator=g), torch.ones(3, 5)
    mask[0, 3:] = 0  # lengths differ, so token_mean and seq_mean_token_mean differ
    kw: dict[str, Any] = {"clip_low": 0.125, "clip_high": 0.375}
    mine, _ = compute_policy_loss(lp, old, adv, mask, algorithm=THROWAWAY, **kw)  # its token_mean
    grpo, _ = compute_policy_loss(lp, old, adv, mask, algorithm="grpo", loss_agg="token_mean", **kw)
    grpo_smtm, _ = compute_policy_loss(lp, old, adv, mask, algorithm="grpo", **kw)
    assert torch.equal(mine, grpo) and not torch.equal(mine, grpo_smtm)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"paper_clip": (0.0, 0.2)}, "paper clip ranges must be positive"),
        ({"paper_clip": (0.2, 0.2), "paper_loss_agg": "token_sum"}, "unknown loss aggregation"),
        (
            {"paper_clip": (0.2, 0.2), "paper_loss_agg": "token_mean", "loss_aggs": {SMTM}},
            "paper_loss_agg token_mean is not among",
        ),
    ],
)
def test_a_spec_with_impossible_values_is_refused(kwargs: dict[str, Any], match: str) -> None:
    loss = LOSS_SPECS.get("grpo").loss
    if "loss_aggs" in kwargs:
        kwargs = {**kwargs, "loss_aggs": frozenset(kwargs["loss_aggs"])}
    with pytest.raises((ValueError, UnknownNameError), match=match):
        LossSpec(loss, **kwargs)
