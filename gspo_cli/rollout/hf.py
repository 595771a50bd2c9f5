"""Rollouts with HF transformers `generate`: batched, KV-cached, on the training model itself.

Sampling uses only the recipe's knobs (temperature, top-p, top-k): a checkpoint's
`generation_config.json` knobs that the trainer's log-probs do not model (repetition_penalty,
no_repeat_ngram_size...) are set aside while generating, and named once in a warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from gspo_cli.models.forward.capabilities import ModelCapabilities, capabilities_of
from gspo_cli.models.routing import ExpertRouting, Recording, RoutingError
from gspo_cli.rollout.base import RolloutBatch, Rows, SamplingParams
from gspo_cli.rollout.decode import decode_dropping_finished
from gspo_cli.rollout.seeded import ExactSampling, row_seeds
from gspo_cli.rollout.stop import StopStrings

log = logging.getLogger(__name__)

# generation_config.json keys that change which tokens are sampled beyond our own knobs.
UNMODELLED_KNOBS = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "encoder_repetition_penalty",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "min_length",
    "min_new_tokens",
    "exponential_decay_length_penalty",
    "sequence_bias",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "min_p",
    "top_h",
)


class ChosenTokenLogprobs(LogitsProcessor):
    """Records log pi(y_t) from the raw logits at the temperature, one step at a time.

    Runs first in the processor list, so it sees the model's logits before any warper. The
    `[a, V]` log-softmax of step t is kept only until token t is known (the next call, or
    `step_done` in the loop that drops finished rows, or `finish`), so memory stays at one
    step's vocabulary row per sequence.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.pending: torch.Tensor | None = None  # [a, V] log-softmax of the last step
        self.rows: torch.Tensor | None = None  # [a] original index of each current row
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows [a], log-probs [a])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        if self.rows is None:
            self.rows = torch.arange(scores.shape[0], device=scores.device)
        wide = scores.to(torch.promote_types(scores.dtype, torch.float32))  # fp64 stays fp64
        self.pending = torch.log_softmax(wide / self.temperature, dim=-1)  # [a, V]
        return scores

    def step_done(self, chosen: torch.Tensor, going: torch.Tensor) -> None:
        self._take(chosen)
        assert self.rows is not None
        self.rows = self.rows[going]

    def _take(self, tokens: torch.Tensor) -> None:
        if self.pending is not None and self.rows is not None:
            self.steps.append((self.rows, self.pending.gather(-1, tokens[:, None])[:, 0]))
            self.pending = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """`[n, T]` log-probs of the generated tokens once generation is over (after a row's
        end: 0 from the loop, the pad token's from `generate`; callers cut rows to length);
        `last_tokens` `[n]` is the last column returned."""
        self._take(last_tokens)
        dtype = self.steps[0][1].dtype
        out = torch.zeros(len(self.steps[0][0]), len(self.steps), dtype=dtype)  # [n, T]
        for t, (rows, logprobs) in enumerate(self.steps):
            out[rows.cpu(), t] = logprobs.cpu()
        return out


class HFGenerateEngine:
    """Samples from the policy with `model.generate`; shares weights with the trainer."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch: int = 256,
        synced_gpus: bool = False,
        capabilities: ModelCapabilities | None = None,
        *,
        extra_processors: Sequence[LogitsProcessor] = (),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch  # sequences per generate call, to bound memory
        self.synced_gpus = synced_gpus  # ZeRO-3: every rank joins every forward
        # the training engine's decision about the model's forward; eval: the model's own
        self.capabilities = capabilities or capabilities_of(model)
        # run after ours on every sampled token (a benchmark's length control, say); a stateful
        # one sees every generate call of this engine
        self.extra_processors = list(extra_processors)
        self._warned = False

    def sync_weights(self) -> None:
        """Nothing to do: generation runs on the training model's own parameters."""

    def close(self) -> None:
        """Nothing to free: the model belongs to the trainer."""

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        rows: Rows | None = None,
    ) -> RolloutBatch:
        batch = RolloutBatch([], [], [] if params.logprobs else None, [], [])
        if params.routed_experts:
            if not self.capabilities.records_routing:
                raise RoutingError("routed experts asked of a dense model")
            batch.routed_experts = []
        was_training = self.model.training
        saved_config = self.model.generation_config
        self.model.generation_config = self._neutral_config(saved_config)
        self.model.eval()
        try:
            repeated = [p for p in prompts for _ in range(params.num_samples)]
            # With seeds, every response draws its own noise: batching-independent, batched.
            response_seeds = None if seeds is None else row_seeds(seeds, params.num_samples)
            for start in range(0, len(repeated), self.max_batch):
                chunk = slice(start, start + self.max_batch)
                chunk_seeds = None if response_seeds is None else response_seeds[chunk]
                self._generate_chunk(repeated[chunk], params, batch, chunk_seeds)
        finally:
            self.model.generation_config = saved_config
            self.model.train(was_training)
        return batch

    def _neutral_config(self, saved: GenerationConfig) -> GenerationConfig:
        """The model's generation config without sampling knobs the trainer does not model."""
        if not self._warned:
            self._warned = True
            defaults = GenerationConfig()
            ignored = [
                f"{k}={getattr(saved, k)!r}"
                for k in UNMODELLED_KNOBS
                if getattr(saved, k, None) not in (None, getattr(defaults, k, None))
            ]
            if ignored:
                log.warning(
                    "rollouts ignore the checkpoint's generation_config.json %s: the trainer's "
                    "log-probs do not model them",
                    ", ".join(ignored),
                )
        return GenerationConfig(
            bos_token_id=saved.bos_token_id,
            eos_token_id=saved.eos_token_id,
            pad_token_id=saved.pad_token_id,
        )

    def _processors(
        self,
        params: SamplingParams,
        recorder: ChosenTokenLogprobs | None,
        seeds: list[int] | None,
        stop: StopStrings | None = None,
    ) -> LogitsProcessorList:
        """Our own list, in order: record raw log-probs first, then temperature, top-k, top-p,
        the caller's `extra_processors` (they shape the law drawn from, e.g. a forbidden EOS),
        then our exact draw for a greedy pick where `_exact_sampling` says so: it leaves one
        finite logit per row, so nothing may come after it."""
        processors = LogitsProcessorList([recorder] if recorder is not None else [])
        if params.temperature > 0:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        processors.extend(self.extra_processors)
        if params.temperature > 0 and self._exact_sampling(params, seeds):
            processors.append(ExactSampling(seeds))
        if stop is not None:  # forces end-of-turn after a stop string: after every draw
            processors.append(stop)
        return processors

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _exact_sampling(self, params: SamplingParams, seeds: list[int] | None) -> bool:
        """Sample by our own draw and a greedy pick (seeded.py): always when seeded (per-row
        draws), and on CPU without seeds too (faster than softmax + multinomial); on GPUs
        `generate` samples."""
        return params.temperature > 0 and (seeds is not None or self._device.type == "cpu")

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        out: RolloutBatch,
        seeds: list[int] | None = None,
    ) -> None:
        pad_id = int(self.tokenizer.pad_token_id)
        eos_id = int(self.tokenizer.eos_token_id)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [n, P]
        attention = torch.zeros_like(input_ids)  # [n, P], left padding
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        recorder = ChosenTokenLogprobs(params.temperature) if params.logprobs else None
        stop = StopStrings(params.stop, self.tokenizer, width) if params.stop else None
        routing = ExpertRouting.of(self.model) if out.routed_experts is not None else None
        with contextlib.nullcontext(None) if routing is None else routing.record() as experts:
            # the routing recorder wants every row at every step, as `generate` forwards them
            generated = self._sample(
                input_ids, attention, params, recorder, seeds, routing is None, stop
            )
        new_tokens = generated[:, width:]  # [n, T]
        logprobs = recorder.finish(new_tokens[:, -1]).cpu() if recorder is not None else None
        new_tokens = new_tokens.cpu()
        for i, p in enumerate(prompts):
            tokens = new_tokens[i].tolist()
            length = tokens.index(eos_id) + 1 if eos_id in tokens else len(tokens)
            if stop is not None and i in stop.stopped:  # the forced end-of-turn is not kept
                length -= 1
            out.prompt_ids.append(p)
            out.completion_ids.append(tokens[:length])
            if out.completion_logprobs is not None and logprobs is not None:
                out.completion_logprobs.append(logprobs[i, :length].clone())
            out.texts.append(self.tokenizer.decode(tokens[:length], skip_special_tokens=True))
            out.truncated.append(eos_id not in tokens[:length] and not (stop and i in stop.stopped))
        if out.routed_experts is not None and experts is not None:
            out.routed_experts += _forwarded_routing(experts, prompts, out.completion_ids, width)

    def _sample(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        params: SamplingParams,
        recorder: ChosenTokenLogprobs | None,
        seeds: list[int] | None,
        drop_finished: bool = True,
        stop: StopStrings | None = None,
    ) -> torch.Tensor:
        """`[n, P + T]` prompts and sampled tokens, greedy over the drawn scores where
        `_exact_sampling` (the draw is the sampling): from the loop that drops finished rows
        where it can (one process per forward: not under ZeRO-3's synced forwards), else from
        `generate`."""
        device = self._device
        eos_id, pad_id = int(self.tokenizer.eos_token_id), int(self.tokenizer.pad_token_id)
        do_sample = params.temperature > 0 and not self._exact_sampling(params, seeds)
        processors = self._processors(params, recorder, seeds, stop)
        loop = drop_finished and not do_sample and not self.synced_gpus
        if loop and self.capabilities.drops_finished_rows:
            return decode_dropping_finished(
                self.model,
                input_ids.to(device),
                attention.to(device),
                processors,
                params.max_new_tokens,
                eos_id,
                pad_id,
            )
        # temperature/top-k/top-p are neutral here: our processors apply them, after the recorder
        # (greedy generate takes no sampling knobs at all, or warns that it ignores them).
        neutral = {"temperature": 1.0, "top_p": 1.0, "top_k": 0} if do_sample else {}
        return self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=do_sample,
            **neutral,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            logits_processor=processors,
            synced_gpus=self.synced_gpus,
        )


def _forwarded_routing(
    experts: Recording, prompts: list[list[int]], completions: list[list[int]], width: int
) -> list[torch.Tensor]:
    """Per sequence `[L, len(prompt) + len(completion) - 1, k]`: the experts of every token
    `generate` forwarded (the last sampled token never is), prompt padding and post-EOS steps cut.
    """
    n = len(prompts)
    routing = experts.routing(n)  # [L, n, P + decoding steps, k]
    completions = completions[-n:]  # this chunk's rows
    return [
        routing[:, i, width - len(p) : width + len(c) - 1].clone()
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
