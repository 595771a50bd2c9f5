"""gspo-cli's side: `rl_step` with TorchEngine and HFGenerateEngine (the length processor
through its `extra_processors`; no MoE volatility probe on the equal-work side, through
`StepSettings.measure_volatility`; on a LoRA shape, the recipe's `model.lora`)."""

from __future__ import annotations

from typing import Any

from cycle import MINIBATCHES, PROMPTS, SAMPLES

from .calls import Calls
from .shapes import LORA_ALPHA, LORA_R, LORA_TARGETS, LR, MAX_GRAD_NORM, Shape
from .workloads import Rewards, length_processor, max_new_tokens, workload_prompts


class CountedRollout:
    """A rollout engine whose every `generate` counts as one generate call (gspo-cli's own
    decoding loop, which drops finished rows, or `generate`), its forwards as decode steps."""

    def __init__(self, engine: Any, calls: Calls) -> None:
        self.engine = engine
        self.generate = calls.counted(engine.generate)

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def close(self) -> None:
        self.engine.close()


class GspoSide:
    def __init__(
        self, model: Any, tokenizer: Any, shape: Shape, workload: str, skip: bool, calls: Calls
    ) -> None:
        from gspo_cli.recipe import Recipe
        from gspo_cli.rollout.base import SamplingParams
        from gspo_cli.rollout.hf import HFGenerateEngine
        from gspo_cli.train.engines.distributed import LOCAL
        from gspo_cli.train.engines.settings import engine_settings
        from gspo_cli.train.engines.torch_engine import TorchEngine
        from gspo_cli.train.run.step_settings import algorithm_settings, collection_settings
        from gspo_cli.train.step.settings import StepSettings

        lengths = length_processor(tokenizer, workload)
        lora = {"r": LORA_R, "alpha": LORA_ALPHA, "target_modules": LORA_TARGETS}
        recipe = Recipe.model_validate(
            {
                "model": {"lora": lora if shape.lora else {"r": 0}},
                "algorithm": {"name": "gspo", "minibatches": MINIBATCHES},
                "optimizer": {"lr": LR, "max_grad_norm": MAX_GRAD_NORM},
                "trainer": {"share_prompts": skip},  # equal work: a prompt per response
            }
        )
        params = SamplingParams(
            temperature=1.0, max_new_tokens=max_new_tokens(shape, workload), num_samples=SAMPLES
        )
        self.settings = StepSettings(
            algorithm=algorithm_settings(recipe.algorithm),
            sampling=params,
            pad_id=int(tokenizer.pad_token_id),
            collection=collection_settings(recipe.rollout),
            skip_zero_advantage=skip,
            # equal work: no MoE volatility probe (one extra forward per update)
            measure_volatility=skip,
        )
        self.engine = TorchEngine(model, engine_settings(recipe), LOCAL)
        extra = [] if lengths is None else [lengths]
        self.rollout = CountedRollout(
            HFGenerateEngine(model, tokenizer, extra_processors=extra), calls
        )
        texts, answers = workload_prompts(tokenizer, workload)
        self.prompts = [tokenizer(t)["input_ids"] for t in texts]
        self.rewards = Rewards(workload, answers)
        self.cycles = 0

    def cycle(self) -> dict[str, Any]:
        from gspo_cli.train.step.rewards import RewardScores
        from gspo_cli.train.step.update import StepModels, rl_step

        def reward(texts: list[str], rows: list[Any], completion_ids: Any) -> RewardScores:
            scores = self.rewards(texts, [row["prompt"] for row in rows])
            return RewardScores(scores, scores, {})

        rows = [{"prompt": i} for i in range(PROMPTS)]  # rl_step repeats them per sample
        step, self.cycles = self.cycles, self.cycles + 1
        models = StepModels(self.engine)
        out = rl_step(models, self.rollout, reward, self.prompts, rows, self.settings, step)
        prompts = [i for i in range(PROMPTS) for _ in range(SAMPLES)]  # the rollout's order
        return self.rewards.result(prompts, [len(c) for c in out.rollout.completion_ids])
