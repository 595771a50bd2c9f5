"""Rollouts with HF transformers `generate`: batched, KV-cached, on the training model itself."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.rollout.base import RolloutBatch, SamplingParams


class HFGenerateEngine:
    """Samples from the policy with `model.generate`; shares weights with the trainer."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch: int = 256,
        synced_gpus: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch  # sequences per generate call, to bound memory
        self.synced_gpus = synced_gpus  # ZeRO-3: every rank joins every forward

    def sync_weights(self) -> None:
        """Nothing to do: generation runs on the training model's own parameters."""

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> RolloutBatch:
        batch = RolloutBatch([], [], [], [], [])
        was_training = self.model.training
        self.model.eval()
        try:
            if seeds is None:
                repeated = [p for p in prompts for _ in range(params.num_samples)]
                for start in range(0, len(repeated), self.max_batch):
                    self._generate_chunk(repeated[start : start + self.max_batch], params, batch)
            else:  # one generate call per prompt, on its own seed: slower, batching-independent
                for prompt, seed in zip(prompts, seeds, strict=True):
                    with torch.random.fork_rng(devices=self._cuda_devices()):
                        torch.manual_seed(seed)
                        self._generate_chunk([prompt] * params.num_samples, params, batch)
        finally:
            self.model.train(was_training)
        return batch

    def _cuda_devices(self) -> list[int]:
        device = next(self.model.parameters()).device
        return [device.index or 0] if device.type == "cuda" else []

    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, out: RolloutBatch
    ) -> None:
        device = next(self.model.parameters()).device
        pad_id = int(self.tokenizer.pad_token_id)
        eos_id = int(self.tokenizer.eos_token_id)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [n, P]
        attention = torch.zeros_like(input_ids)  # [n, P], left padding
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        greedy = params.temperature == 0
        generated = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None if greedy or params.top_k == 0 else params.top_k,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            synced_gpus=self.synced_gpus,
        )
        new_tokens = generated.sequences[:, width:].cpu()  # [n, T]
        # Raw logits, scaled by the temperature: the log-probs the trainer computes too.
        logits = torch.stack(generated.logits, dim=1).float().cpu()  # [n, T, V]
        if not greedy:
            logits = logits / params.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1))[..., 0]
        for i, p in enumerate(prompts):
            tokens = new_tokens[i].tolist()
            length = tokens.index(eos_id) + 1 if eos_id in tokens else len(tokens)
            out.prompt_ids.append(p)
            out.completion_ids.append(tokens[:length])
            out.completion_logprobs.append(logprobs[i, :length].clone())
            out.texts.append(self.tokenizer.decode(tokens[:length], skip_special_tokens=True))
            out.truncated.append(eos_id not in tokens[:length])
