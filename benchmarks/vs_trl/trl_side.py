"""TRL's side: GRPOTrainer.train, held in lockstep with the parent by a callback (needs TRL:
.venv-trl)."""

from __future__ import annotations

import tempfile
import time
from typing import Any

from cycle import MINIBATCHES, ROWS, SAMPLES

from .calls import Calls
from .channel import Channel
from .shapes import CLIP_HIGH, CLIP_LOW, LR, MAX_GRAD_NORM, Shape, peft_lora_config
from .workloads import Rewards, length_processor, max_new_tokens, workload_prompts


def run_trl(
    model: Any,
    tokenizer: Any,
    shape: Shape,
    workload: str,
    cycles: int,
    chan: Channel,
    calls: Calls,
) -> None:
    """GRPOTrainer.train over `cycles` generations; a callback holds every cycle for the
    parent's go and times it (from the first step's start to the fourth step's end)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    texts, answers = workload_prompts(tokenizer, workload)
    index = {text: i for i, text in enumerate(texts)}
    rewards = Rewards(workload, answers)
    results: list[dict[str, Any]] = []

    def reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:  # once per generation batch of 64 (one cycle)
        rows = [index[p] for p in prompts]
        scores = rewards(completions, rows)
        results.append(rewards.result(rows, [len(c) for c in completion_ids]))
        return scores

    class Lockstep(TrainerCallback):
        start = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % MINIBATCHES == 0:
                chan.wait()
                calls.take()
                self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % MINIBATCHES == 0:
                seconds = time.perf_counter() - self.start
                chan.send(seconds=seconds, **results.pop(), calls=calls.take())

    moe = {"router_aux_loss_coef": 0.0} if "moe" in shape.model else {}
    eos = int(tokenizer.eos_token_id)
    if workload == "realistic":  # TRL passes no processors of its own to generate
        calls.processor = length_processor(tokenizer, workload)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            seed=0,
            per_device_train_batch_size=ROWS // MINIBATCHES,
            gradient_accumulation_steps=1,
            steps_per_generation=MINIBATCHES,
            num_generations=SAMPLES,
            num_iterations=1,
            max_steps=cycles * MINIBATCHES,
            max_completion_length=max_new_tokens(shape, workload),
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            generation_kwargs={"suppress_tokens": [eos]} if workload == "fixed" else None,
            beta=0.0,
            loss_type="grpo",
            importance_sampling_level="sequence",
            epsilon=CLIP_LOW,
            epsilon_high=CLIP_HIGH,
            scale_rewards="group",
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=MAX_GRAD_NORM,
            gradient_checkpointing=False,
            bf16=False,
            logging_strategy="no",
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            **moe,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": texts}),
            processing_class=tokenizer,
            callbacks=[Lockstep()],
            peft_config=peft_lora_config() if shape.lora else None,
        )
        trainer.train()
