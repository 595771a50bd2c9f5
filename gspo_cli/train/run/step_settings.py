"""The RL step's settings (train/step/settings.py), built once from a validated recipe: the one
place where a step's values are read off the recipe and resolved."""

from __future__ import annotations

from gspo_cli.algorithms import CorrectionLimits, resolve_loss_agg
from gspo_cli.core.engine_catalogue import ROLLOUT_ENGINES
from gspo_cli.recipe.algorithm import AlgorithmConfig
from gspo_cli.recipe.rollout import MAX_DYNAMIC_SAMPLING_ROUNDS, RolloutConfig
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.train.step.old_policy import PiOldTiming, resolve_engine_logprobs
from gspo_cli.train.step.settings import (
    AlgorithmSettings,
    CollectionSettings,
    CorrectionSettings,
    DistillSettings,
    EngineLogprobs,
    KlSettings,
    LossSettings,
    RoutingSettings,
    StepSettings,
)


def step_settings(recipe: Recipe, pad_id: int, world: int = 1) -> StepSettings:
    """What an RL step needs of `recipe` (the run's, or a benchmark's) on `world` processes."""
    return StepSettings(
        algorithm=algorithm_settings(recipe.algorithm),
        sampling=rollout_params(recipe),
        pad_id=pad_id,
        collection=collection_settings(recipe.rollout, world),
        micro_batch_size=recipe.trainer.micro_batch_size,
        use_engine_logprobs=engine_logprobs_mode(recipe),
        max_tokens_per_micro_batch=recipe.trainer.max_tokens_per_micro_batch,
        skip_zero_advantage=recipe.trainer.skip_zero_advantage,
        overlong_buffer=recipe.reward.overlong_buffer,
        overlong_penalty=recipe.reward.overlong_penalty,
    )


def algorithm_settings(config: AlgorithmConfig) -> AlgorithmSettings:
    """`algorithm` resolved: the recipe's validation has filled in the paper's clip range and
    aggregation (AlgorithmConfig._paper_clip_defaults)."""
    if config.clip_low is None or config.clip_high is None:
        raise ValueError("algorithm.clip_low/clip_high are unresolved: validate the recipe first")
    distill = config.distill
    return AlgorithmSettings(
        loss=LossSettings(
            name=config.name,
            clip_low=float(config.clip_low),
            clip_high=float(config.clip_high),
            aggregation=resolve_loss_agg(config.name, config.loss_agg),
            options=config.loss_options(),
            kl=KlSettings(
                coef=config.kl_coef,
                estimator=config.kl_estimator,
                in_reward=config.kl_coef != 0 and config.kl_in == "reward",
            ),
            entropy_coef=config.entropy_coef,
            sequence_unit=config.sequence_unit,
        ),
        minibatches=config.minibatches,
        scale_advantages=config.scale_advantages,
        mask_truncated=config.mask_truncated,
        correction=CorrectionSettings(
            config.rollout_correction,
            CorrectionLimits(config.correction_cap, config.correction_band),
        ),
        routing=RoutingSettings(config.routing_replay, config.router_aux_coef),
        distill=None
        if distill is None
        else DistillSettings(distill.coef, distill.task_reward_coef),
    )


def collection_settings(rollout: RolloutConfig, world: int = 1) -> CollectionSettings:
    """How a step draws its prompts; with several processes each prompt is seeded on its own."""
    return CollectionSettings(
        num_prompts=rollout.num_prompts,
        per_prompt_seeds=rollout.seed_per_prompt or world > 1,
        dynamic=rollout.dynamic_sampling,
        max_rounds=rollout.dynamic_sampling_max_rounds,
        round_limit=MAX_DYNAMIC_SAMPLING_ROUNDS,
    )


def engine_logprobs_mode(recipe: Recipe) -> EngineLogprobs:
    """`rollout.use_engine_logprobs` resolved for this recipe (`auto` where it can apply)."""
    algorithm = recipe.algorithm
    return resolve_engine_logprobs(
        recipe.rollout.use_engine_logprobs,
        algorithm=algorithm.name,
        rollout_correction=algorithm.rollout_correction,
        top_p=recipe.rollout.top_p,
        top_k=recipe.rollout.top_k,
        routing_replay=algorithm.routing_replay,
        timing=PiOldTiming(
            # a KL in the reward and distillation both read pi_old of every row before the
            # updates
            before_advantages=(algorithm.kl_coef > 0 and algorithm.kl_in == "reward")
            or algorithm.distill is not None,
            asynchronous=recipe.rollout.max_staleness > 0,
        ),
    )


def rollout_params(recipe: Recipe) -> SamplingParams:
    """Sampling for RL steps; engine log-probs only where something reads them (pi_old, the
    rollout correction, or the mismatch metrics of an engine with its own weights)."""
    r = recipe.rollout
    wanted = (
        engine_logprobs_mode(recipe) is not False
        or recipe.algorithm.rollout_correction != "off"
        or (ROLLOUT_ENGINES.get(r.engine).keeps_own_weights and r.top_p == 1 and r.top_k == 0)
    )
    return SamplingParams(
        r.temperature,
        r.top_p,
        r.top_k,
        r.max_new_tokens,
        r.group_size,
        logprobs=wanted,
        routed_experts=recipe.algorithm.routing_replay == "rollout",
    )
