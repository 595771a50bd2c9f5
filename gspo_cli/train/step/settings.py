"""What one RL step needs of the recipe, as plain values, and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from gspo_cli.models.forward.logprobs import EntropyMode
from gspo_cli.recipe.algorithm import AlgorithmConfig
from gspo_cli.rollout.base import RolloutBatch, SamplingParams
from gspo_cli.train.step.old_policy import EngineLogprobs


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    """What one RL step needs of the recipe, as plain values (built in train/run/prepare.py)."""

    algorithm: AlgorithmConfig
    sampling: SamplingParams
    pad_id: int
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
        algo = self.algorithm
        kl_in_loss = algo.kl_coef != 0 and algo.kl_in == "loss"
        extra_terms = kl_in_loss or algo.entropy_coef != 0 or algo.router_aux_coef != 0
        return self.skip_zero_advantage and not extra_terms

    @property
    def kl_in_reward(self) -> bool:
        return self.algorithm.kl_coef != 0 and self.algorithm.kl_in == "reward"

    @property
    def entropy_mode(self) -> EntropyMode:
        """The entropy a training forward returns: with grad for the entropy bonus."""
        return "grad" if self.algorithm.entropy_coef != 0 else True


@dataclass
class StepOutput:
    metrics: dict[str, float]
    rollout: RolloutBatch
    rewards: list[float]
    index: list[int] = field(default_factory=list)  # the prompts' rows (set by the loop)
