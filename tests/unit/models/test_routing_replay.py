"""MoE Routing Replay: the experts are seen and forced exactly, in any HF MoE architecture."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PreTrainedModel,
)

from gspo_cli.models import create_builtin, is_moe
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.logprobs import response_logprobs
from gspo_cli.models.routing import ExpertRouting, RoutingError, join_rows, split_rows, volatility
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import TorchEngine
from gspo_cli.train.step.replay import ProbeRow, StepRouting
from gspo_cli.train.step.settings import RoutingSettings
from gspo_cli.train.step.train_batch import build_train_batch
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.rl_helpers import PROMPTS, LengthParityReward, tiny_step

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 32,
    "num_experts_per_tok": 2,
}


def _qwen3_moe() -> PreTrainedModel:
    return create_builtin("tiny-moe", seed=0)[0]


def _mixtral() -> PreTrainedModel:
    return MixtralForCausalLM(MixtralConfig(**SMALL, num_local_experts=4))


def _deepseek_v3() -> PreTrainedModel:
    """`n_routed_experts`, group-limited choice (two topk calls), a shared expert."""
    config = DeepseekV3Config(
        **SMALL,
        moe_intermediate_size=16,
        n_routed_experts=8,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=0,
        n_shared_experts=1,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
    )
    return DeepseekV3ForCausalLM(config)


def _olmoe() -> PreTrainedModel:
    return OlmoeForCausalLM(OlmoeConfig(**SMALL, num_experts=4))


ARCHITECTURES: dict[str, Callable[[], PreTrainedModel]] = {
    "qwen3_moe": _qwen3_moe,
    "mixtral": _mixtral,
    "deepseek_v3": _deepseek_v3,
    "olmoe": _olmoe,
}


def _batch(vocab: int, seed: int = 0) -> TrainBatch:
    """3 sequences, left-padded prompts of 4-6 tokens, right-padded responses of 3-7 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (4, 6, 5)]
    responses = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (7, 3, 5)]
    return build_train_batch(RolloutBatch(prompts, responses, None, [""] * 3, [False] * 3), 0)


def _natural_routing(
    model: PreTrainedModel, routing: ExpertRouting, batch: TrainBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """(forced `[L, n, W, k]`, where `[n, W]`): the router's own choice, ready to replay."""
    with torch.no_grad(), routing.record() as recording:
        response_logprobs(model, batch, 1.0)
    rows = split_rows(recording.routing(batch.input_ids.shape[0]), batch.attention_mask)
    return join_rows(rows, batch.attention_mask)


def _move_weights(model: PreTrainedModel, batch: TrainBatch) -> None:
    """A few large AdamW steps on the log-likelihood: far enough to re-route tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    for _ in range(5):
        logprobs, _ = response_logprobs(model, batch, 1.0)
        (-(logprobs * batch.response_mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_replay_reproduces_the_cached_routing_bit_for_bit(name: str) -> None:
    torch.manual_seed(0)
    model = ARCHITECTURES[name]()
    assert is_moe(model.config)
    routing = ExpertRouting.of(model)
    assert routing is not None
    batch = _batch(model.config.vocab_size)
    real = batch.attention_mask.bool()
    theta_old = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad(), routing.record() as recording:
        cached_lp, _ = response_logprobs(model, batch, 1.0)  # pi_old, float32
    cached = split_rows(recording.routing(3), batch.attention_mask)  # per sequence
    forced, where = join_rows(cached, batch.attention_mask)

    _move_weights(model, batch)
    with torch.no_grad(), routing.record() as free:
        free_lp, _ = response_logprobs(model, batch, 1.0)
    moved = volatility(forced[:, real], free.routing(3)[:, real])  # [L]
    assert float(moved.mean()) > 0.05, "the weights did not move far enough to re-route"
    with torch.no_grad(), routing.record() as replayed, routing.replay(forced, where):
        replay_lp, _ = response_logprobs(model, batch, 1.0)
    assert torch.equal(replayed.routing(3)[:, real], forced[:, real])  # the cached experts
    assert not torch.equal(replay_lp, free_lp)

    model.load_state_dict(theta_old)  # pi_old recomputed under replay: bit for bit
    with torch.no_grad(), routing.replay(forced, where):
        recomputed, _ = response_logprobs(model, batch, 1.0)
    assert torch.equal(recomputed, cached_lp)


def test_replay_keeps_the_routers_gradient() -> None:
    torch.manual_seed(0)
    model = _qwen3_moe()
    routing = ExpertRouting.of(model)
    assert routing is not None
    batch = _batch(model.config.vocab_size)
    forced, where = _natural_routing(model, routing, batch)
    with routing.replay(forced, where):
        logprobs, _ = response_logprobs(model, batch, 1.0)
    logprobs.sum().backward()
    gates = [p.grad for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")]
    assert gates and all(g is not None and bool(g.abs().sum() > 0) for g in gates)


def test_idle_hooks_change_nothing() -> None:
    """Replay off: a model with the hooks attached computes exactly what a bare one does."""
    torch.manual_seed(0)
    hooked, bare = _qwen3_moe(), _qwen3_moe()
    assert ExpertRouting.of(hooked) is not None
    batch = _batch(hooked.config.vocab_size)
    outputs = []
    for model in (hooked, bare):
        logprobs, _ = response_logprobs(model, batch, 1.0)
        logprobs.sum().backward()
        outputs.append((logprobs.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp_a, grads_a), (lp_b, grads_b) = outputs
    assert torch.equal(lp_a, lp_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


def test_a_router_that_does_not_choose_by_topk_fails_loudly() -> None:
    torch.manual_seed(0)
    model = _qwen3_moe()
    routing = ExpertRouting.of(model)
    assert routing is not None
    batch = _batch(model.config.vocab_size)
    for layer in model.model.layers:  # a router that sorts instead of calling topk
        router = layer.mlp.gate

        def by_sort(hidden, router=router):  # type: ignore[no-untyped-def]
            logits = torch.nn.functional.linear(hidden, router.weight)
            probs = logits.softmax(-1)
            order = probs.argsort(-1, descending=True)[..., : router.top_k]
            return logits, probs.gather(-1, order), order

        router.forward = by_sort
    forced, where = _natural_routing(model, routing, batch)
    forced = (forced + 1) % model.config.num_experts  # other experts than the router's
    with torch.no_grad(), routing.replay(forced, where), pytest.raises(RoutingError):
        response_logprobs(model, batch, 1.0)


def test_generation_routing_is_replayed_in_training() -> None:
    """R3: the HF engine returns the experts of every token it forwarded; replaying them in the
    training forward routes exactly so and gives the generation's log-probs."""
    torch.manual_seed(0)
    model, tokenizer = create_builtin("tiny-moe", seed=0)
    params = SamplingParams(max_new_tokens=10, num_samples=3, logprobs=True, routed_experts=True)
    rollout = HFGenerateEngine(model, tokenizer).generate(PROMPTS[:2], params)
    assert rollout.routed_experts is not None and rollout.completion_logprobs is not None
    for prompt, completion, experts in zip(
        rollout.prompt_ids, rollout.completion_ids, rollout.routed_experts, strict=True
    ):
        assert experts.shape == (4, len(prompt) + len(completion) - 1, 2)
    batch = build_train_batch(rollout, int(tokenizer.pad_token_id))
    forced, where = join_rows(rollout.routed_experts, batch.attention_mask)
    routing = ExpertRouting.of(model)
    assert routing is not None
    with torch.no_grad(), routing.record() as free:
        response_logprobs(model, batch, 1.0)
    agree = (free.routing(6)[:, where] == forced[:, where]).all(-1).float().mean()
    assert agree > 0.99  # KV-cached decoding may flip a near tie, rarely
    with torch.no_grad(), routing.record() as replayed, routing.replay(forced, where):
        logprobs, _ = response_logprobs(model, batch, 1.0)
    assert torch.equal(replayed.routing(6)[:, where], forced[:, where])
    for i, engine_lp in enumerate(rollout.completion_logprobs):
        torch.testing.assert_close(logprobs[i, : engine_lp.numel()], engine_lp, atol=1e-5, rtol=0)


def _moe_step(replay: str, aux: float = 0.0) -> dict[str, float]:
    """One GRPO step of 4 updates on the tiny MoE, real rollouts, with the given replay."""
    torch.manual_seed(0)
    model, tokenizer = create_builtin("tiny-moe", seed=0)
    recipe = Recipe.model_validate(
        {
            "algorithm": {
                "name": "grpo",
                "minibatches": 4,
                "routing_replay": replay,
                "router_aux_coef": aux,
            },
            "optimizer": {"lr": 1e-2},
        }
    )
    params = SamplingParams(
        max_new_tokens=12, num_samples=4, routed_experts=replay == "rollout", logprobs=True
    )
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer)
    engine = TorchEngine(model, engine_settings(recipe), LOCAL)
    rows = [{"prompt": "p", "answer": "0"}] * len(PROMPTS)
    rollout = HFGenerateEngine(model, tokenizer)
    return rl_step(
        StepModels(engine), rollout, LengthParityReward(), PROMPTS, rows, settings, 0
    ).metrics


@pytest.mark.parametrize("replay", ["off", "old_policy", "rollout"])
def test_the_step_measures_volatility_per_update(replay: str) -> None:
    metrics = _moe_step(replay)
    updates = [metrics[f"expert_volatility_update{m}"] for m in range(4)]  # one per minibatch
    layers = [metrics[f"expert_volatility_layer{i}"] for i in range(4)]
    assert all(0 <= v <= 1 for v in updates + layers)
    assert metrics["expert_volatility"] == pytest.approx(sum(updates) / 4)
    assert metrics["expert_volatility"] == pytest.approx(sum(layers) / 4)
    assert metrics["first_ratio_gap_max"] < 1e-5  # replay reproduces pi_old in the first forward
    assert all(math.isfinite(v) for v in metrics.values())


class _TwoRanks:
    """A DistContext stand-in whose all_gather returns rank 0's and rank 1's values."""

    def __init__(self, other: object) -> None:
        self.other = other

    def all_gather(self, value: object) -> list[object]:
        return [value, self.other]


def test_volatility_keeps_the_globally_first_probe_rows_over_ranks() -> None:
    """Each rank probes its own first rows; the metric keeps the first PROBE_ROWS rows by
    global index wherever they sit, weighted by their tokens: the same rows (and figure) as
    one process measures, at any world size."""
    plan = StepRouting(_qwen3_moe(), RoutingSettings("off", aux_coef=0.0), 4, None)
    # update 0: rank 0 holds rows 8 and 9, rank 1 rows 0 and 1 (the global first two);
    # update 1: rank 0 trained nothing (its stand-in is uncounted), rank 1 rows 2 and 5.
    plan.updates = [
        [ProbeRow(8, [4.0] * 4, 4), ProbeRow(9, [4.0] * 4, 4)],
        [],
    ]
    other = [
        [ProbeRow(0, [1.0, 0.0, 0.0, 0.0], 2), ProbeRow(1, [1.0, 2.0, 0.0, 0.0], 6)],
        [ProbeRow(5, [0.0] * 4, 3), ProbeRow(2, [3.0] * 4, 3)],
    ]
    metrics = plan.metrics(_TwoRanks(other))  # type: ignore[arg-type]
    assert [metrics[f"expert_volatility_layer{i}"] for i in range(4)] == pytest.approx(
        [(2 / 8 + 3 / 6) / 2, (2 / 8 + 3 / 6) / 2, 3 / 6 / 2, 3 / 6 / 2]
    )
    assert metrics["expert_volatility_update0"] == pytest.approx((2 / 8 + 2 / 8) / 4)
    assert metrics["expert_volatility_update1"] == pytest.approx(0.5)


def test_router_aux_loss_is_the_models_own_and_off_by_default() -> None:
    torch.manual_seed(0)
    model = _qwen3_moe()
    batch = _batch(model.config.vocab_size)
    expected = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        output_router_logits=True,
    ).aux_loss
    plan = StepRouting(model, RoutingSettings("off", aux_coef=0.5), 3, None)
    index = torch.arange(3)
    with plan.training_forward(batch, index) as logits:
        response_logprobs(model, batch, 1.0)
    aux = plan.aux_loss(logits, batch)
    assert aux is not None
    torch.testing.assert_close(aux, 0.5 * expected)
    assert aux.requires_grad
    off = RoutingSettings("off", aux_coef=0.0)
    with StepRouting(model, off, 3, None).training_forward(batch, index) as none:
        assert none is None
    metrics = _moe_step("off", aux=0.01)
    assert metrics["router_aux_loss"] > 0
