"""What one RL step needs of the recipe, as resolved plain values, and what it returns.

Every value here is built once, at prepare time (train/run/step_settings.py), from a validated
recipe: the defaults a recipe leaves to the paper (clip range, loss aggregation) are filled in
there, so a step reads values and never resolves a rule again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gspo_cli.algorithms import CorrectionLimits, LossOptions
from gspo_cli.models.forward.logprobs import EntropyMode
from gspo_cli.rollout.base import RolloutBatch, SamplingParams

# rollout.use_engine_logprobs as a step runs it (old_policy.resolve_engine_logprobs)
EngineLogprobs = bool | Literal["auto"]
SequenceUnit = Literal["trajectory", "turn"]
RoutingReplay = Literal["off", "old_policy", "rollout"]


@dataclass(frozen=True)
class KlSettings:
    """The KL penalty to the reference policy (docs/options/kl-and-entropy.md)."""

    coef: float  # algorithm.kl_coef; 0 = off
    estimator: str  # the registered per-token estimator (k1, k2, k3, low_var_kl)
    in_reward: bool  # on, in each response's reward (no gradient); else, with coef, in the loss

    @property
    def loss_coef(self) -> float:
        """The weight of the per-token KL term in the loss: 0 when the KL sits in the reward."""
        return 0.0 if self.in_reward else self.coef


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    """The policy loss each micro-batch takes, its recipe defaults resolved."""

    name: str  # the registered policy loss (gspo, grpo, ...)
    clip_low: float  # eps_low, the paper's where the recipe left it unset
    clip_high: float  # eps_high, likewise
    aggregation: str  # loss_agg, the paper's where the recipe left it unset
    options: LossOptions  # knobs beyond the clip range (SAPO's gate temperatures)
    kl: KlSettings
    entropy_coef: float  # c_H of the entropy bonus; 0 = off
    sequence_unit: SequenceUnit  # turn: each model turn of a trajectory its own sequence


@dataclass(frozen=True)
class RoutingSettings:
    """MoE routing in a step (train/step/replay.py); dense models ignore it."""

    replay: RoutingReplay  # algorithm.routing_replay
    aux_coef: float  # algorithm.router_aux_coef: the router's load-balancing loss; 0 = off


@dataclass(frozen=True)
class CorrectionSettings:
    """The engine-vs-trainer rollout correction (algorithms/correction.py)."""

    name: str  # off, token_tis, seq_mask, seq_truncate or icepop
    limits: CorrectionLimits  # C, and icepop's band


@dataclass(frozen=True)
class DistillSettings:
    """On-policy distillation's mix: A_t = task_reward_coef x A_i + coef x a_t (distill.py)."""

    coef: float
    task_reward_coef: float


@dataclass(frozen=True, kw_only=True)
class AlgorithmSettings:
    """`algorithm` as a step runs it: resolved plain values."""

    loss: LossSettings
    minibatches: int  # optimiser steps per rollout batch
    scale_advantages: bool  # divide advantages by the group std
    mask_truncated: bool  # DAPO's overlong filtering: truncated responses leave the loss
    correction: CorrectionSettings
    routing: RoutingSettings
    distill: DistillSettings | None  # None: no distillation


@dataclass(frozen=True, kw_only=True)
class CollectionSettings:
    """How a step draws and keeps its prompts (train/step/collection.py)."""

    num_prompts: int  # Q: groups per step
    per_prompt_seeds: bool  # each prompt's samples seeded on their own (always with ranks)
    dynamic: bool = False  # DAPO dynamic sampling
    max_rounds: int = 1  # its rounds at most
    round_limit: int  # the most rounds a recipe may ask (named when a step kept nothing)


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    """What one RL step needs of the recipe, as plain values (train/run/step_settings.py)."""

    algorithm: AlgorithmSettings
    sampling: SamplingParams
    pad_id: int
    collection: CollectionSettings
    micro_batch_size: int = 0  # 0 = a whole minibatch per forward/backward
    use_engine_logprobs: EngineLogprobs = False  # resolved (old_policy.resolve_engine_logprobs)
    max_tokens_per_micro_batch: int = 0  # padded tokens per forward/backward; 0 = no budget
    skip_zero_advantage: bool = True
    overlong_buffer: int = 0  # DAPO's L_cache (reward.overlong_buffer); 0 = no length penalty
    overlong_penalty: float = 1.0  # the penalty at max_new_tokens (reward.overlong_penalty)
    # MoE: expert volatility across each update (step/replay.py's probe: a no-grad forward of
    # PROBE_ROWS rows before and after it); False leaves it out (benchmarks of equal work)
    measure_volatility: bool = True

    @property
    def skips_zero_advantage(self) -> bool:
        """Only where every gradient term is a multiple of the advantage: a KL in the loss, an
        entropy bonus and a router aux loss all still need the zero-advantage rows; a KL in the
        reward only changes the advantages (docs/options/kl-and-entropy.md)."""
        loss = self.algorithm.loss
        extra_terms = (
            loss.kl.loss_coef != 0 or loss.entropy_coef != 0 or self.algorithm.routing.aux_coef != 0
        )
        return self.skip_zero_advantage and not extra_terms

    @property
    def entropy_mode(self) -> EntropyMode:
        """The entropy a training forward returns: with grad for the entropy bonus."""
        return "grad" if self.algorithm.loss.entropy_coef != 0 else True


@dataclass
class StepOutput:
    metrics: dict[str, float]
    rollout: RolloutBatch
    rewards: list[float]
    index: list[int] = field(default_factory=list)  # the prompts' rows (set by the loop)
