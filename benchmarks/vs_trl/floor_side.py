"""The floor: the same counted calls in plain torch, nothing else."""

from __future__ import annotations

from typing import Any

import torch
from cycle import MINIBATCHES, PROMPTS, ROWS, SAMPLES

from .shapes import CLIP_HIGH, CLIP_LOW, LR, MAX_GRAD_NORM, Shape, peft_lora_config
from .workloads import Rewards, length_processor, max_new_tokens, workload_prompts


class FloorSide:
    """The same counted calls in plain torch, nothing else. Responses are right-padded after
    their end-of-turn; each forward is cut to its own rows' longest response (what anyone
    would write; no length sorting, no skipping) with an attention mask over the padding."""

    def __init__(self, model: Any, tokenizer: Any, shape: Shape, workload: str) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens = max_new_tokens(shape, workload)
        processor = length_processor(tokenizer, workload)
        self.processors = [] if processor is None else [processor]
        texts, answers = workload_prompts(tokenizer, workload)
        self.rewards = Rewards(workload, answers)
        if shape.lora:  # peft puts its layers into `model` in place and freezes the rest
            from peft import get_peft_model

            get_peft_model(model, peft_lora_config())
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=LR)
        ids = [tokenizer(t)["input_ids"] for t in texts]
        self.prompts = torch.tensor([p for p in ids for _ in range(SAMPLES)])  # [64, P]
        self.width = self.prompts.shape[1]  # P: every prompt has it (no padding)

    def _logprobs(self, seq: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`[n, w]` log-probs of the responses of `seq` (`[n, P + T]`, `lengths` `[n]`), w the
        longest of them; 0 past a row's end."""
        width = int(lengths.max())
        mask = torch.arange(width) < lengths[:, None]  # [n, w]
        seq = seq[:, : self.width + width]
        attention = torch.cat([torch.ones_like(seq[:, : self.width]), mask.long()], 1)
        logits = self.model(input_ids=seq, attention_mask=attention, logits_to_keep=width + 1)
        logprobs = torch.log_softmax(logits.logits[:, :-1].float(), -1)  # [n, w, V]
        return logprobs.gather(-1, seq[:, self.width :, None])[..., 0] * mask

    def _generate(self) -> torch.Tensor:
        """`[64, P + T]`: the prompts and their responses, pad after each end-of-turn."""
        tokenizer = self.tokenizer
        self.model.eval()
        with torch.no_grad():
            seq = self.model.generate(
                input_ids=self.prompts,
                attention_mask=torch.ones_like(self.prompts),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=int(tokenizer.eos_token_id),
                pad_token_id=int(tokenizer.pad_token_id),
                logits_processor=self.processors,
            )
        self.model.train()
        return seq

    def cycle(self) -> dict[str, Any]:
        tokenizer = self.tokenizer
        seq = self._generate()  # [64, P + T]
        new = seq[:, self.width :]  # [64, T]
        is_eos = new == int(tokenizer.eos_token_id)
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])  # [64]
        texts = tokenizer.batch_decode(
            [row[:n] for row, n in zip(new.tolist(), lengths.tolist(), strict=True)],
            skip_special_tokens=True,
        )
        prompts = [row // SAMPLES for row in range(ROWS)]
        rewards = torch.tensor(self.rewards(texts, prompts)).view(PROMPTS, SAMPLES)
        adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
        adv = adv.flatten()  # [64]
        chunks = torch.randperm(ROWS).chunk(MINIBATCHES)
        old = torch.zeros(new.shape)  # [64, T]
        with torch.no_grad():
            for rows in chunks:
                logprobs = self._logprobs(seq[rows], lengths[rows])
                old[rows, : logprobs.shape[1]] = logprobs
        for rows in chunks:
            logprobs = self._logprobs(seq[rows], lengths[rows])  # [16, w]
            log_ratio = (logprobs - old[rows, : logprobs.shape[1]]).sum(1) / lengths[rows]
            ratio = torch.exp(log_ratio)  # [16], GSPO's sequence-level ratio
            clipped = ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH)
            loss = -torch.minimum(ratio * adv[rows], clipped * adv[rows]).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return self.rewards.result(prompts, lengths.tolist())
