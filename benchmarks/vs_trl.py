"""gspo-cli's RL step against TRL's GRPOTrainer (1.16) on equal work, and both against a floor.

One cycle, the same on every side: 8 prompts x 8 samples generated in one batch (TRL and the
floor: HF `generate`; gspo-cli: its own loop that drops finished rows, counted as a generate),
rewards from a cheap deterministic function (the maths verifier in the quickstart workload),
pi_old by one no-grad pass (4 forwards of 16 sequences), then 4 minibatch AdamW updates (each
one forward and one backward of 16 sequences). Same model, same initial weights, same
transformers, fp32, sampling at temperature 1 with no top-k/top-p, GSPO's sequence-level ratio,
no KL (no reference model), no router aux loss. The response lengths are set by one logits
processor, the same on every side, in two of the three workloads (`--workload`); gspo-cli and
the floor append it to their processor lists:

- fixed (the default): every response exactly L tokens, the end-of-turn token suppressed by
  transformers' own SuppressTokensLogitsProcessor (for TRL: `generation_kwargs=
  {"suppress_tokens": [eos]}`); rewards `score` of the text. Nobody pads: pure equal work.
- realistic: RL on reasoning tasks, as the quickstart measures it (mean response 20.7 tokens).
  max_new_tokens 64 on every shape. Each cycle draws 64 lengths (end-of-turn included),
  seeded by the cycle: round(lognormal(median 17, sigma 0.5)) clamped to [2, 63], which end
  with end-of-turn, then 2 rows at random set to 64 (truncated: no end-of-turn), so every
  padded batch is 64 wide; about 20.6 tokens a row on average, 4 or 5 rows a cycle over 40.
  `RealisticLengths` (realistic_workload.py, with the draws) suppresses end-of-turn before a
  row's last token and forces it there (TRL passes no processors to `generate`: a wrapper of
  the model class's `generate` adds it).
  Rewards do not look at the text: per cycle 1 group of 8 (2 in every fourth cycle: 15.6% of
  groups in the long run, 15% over a five-round run, 12.5% in a one-round run) scores all 0
  or all 1, no signal; every other group has 1 to 7 of its 8 rows at 1. Lengths and rewards
  belong to (cycle, prompt, sample), so every side gets the very same ones. gspo-cli and the
  floor generate prompt-major in prompt order; TRL 1.16's RepeatSampler keeps a prompt's 8
  rows together but shuffles the prompts every generation, so a row is matched through its
  16 prompt tokens (prompts are never padded), never its place in the batch.
  What each side forwards then differs, and legitimately: TRL pads every response to the
  generation batch's longest (64) in all 8 forwards; gspo-cli trims each micro-batch to its
  longest row (and sorts pi_old's rows by length into its 4 no-grad forwards); the floor
  right-pads, cuts each forward to its own 16 rows' longest response with an attention mask,
  rows in the same random minibatches for pi_old and the updates, skipping nothing. The call
  counts must still be equal; the forwarded tokens are printed as information.
- quickstart (tiny-dense only): the quickstart itself. The parent runs its cold start once
  (`gspo sft recipes/quickstart.yaml`, quickstart_workload.py) and every side loads that
  checkpoint; the prompts are 8 of its training problems (those of its commonest prompt
  length, so nobody pads a prompt), max_new_tokens 64 as in the recipe, rewards from its maths
  verifier against the gold answers. Nothing is forced: each side samples its own responses,
  so lengths, tokens and no-signal groups differ from side to side and round to round (all
  printed); compare completion tokens/s, not seconds. Forwarded tokens differ as above.

- gspo: `rl_step` with TorchEngine and HFGenerateEngine, zero-advantage skipping off (equal work),
  one prompt pass per response in training (`trainer.share_prompts: false`; its decoding loop
  still prefills each prompt once) and no MoE volatility probe (gspo-cli's one extra no-grad
  forward of 2 rows after each update);
- gspo (defaults): skipping on, each distinct prompt of a micro-batch run once (dense), and
  the probe on (MoE): rows of no-signal groups leave every forward and backward, so it does
  LESS work whenever a group scores all equal (in the realistic workload by design: that is
  the saving it is there to show), a group's 8 (pi_old) or 2 (an update) responses share one
  prompt forward, its backbone makes two calls per forward (prompts, then responses), and on
  MoE 4 small forwards MORE;
- trl: GRPOTrainer with per_device_train_batch_size=16, steps_per_generation=4 (a generation
  batch of 64), gradient_accumulation_steps=1 and num_iterations=1, so that it computes pi_old
  once per generation (TRL does whenever gradient_accumulation_steps is not a multiple of
  steps_per_generation x num_iterations), beta=0, no vLLM, no gradient checkpointing, no bf16;
- floor: plain torch doing the same counted calls (one `generate` with the same arguments, 4
  no-grad forwards, 4 x forward + backward + clip + AdamW step): what this hardware needs.

Each side runs in its own long-lived process (so that peak RSS is its own) and the rounds are
interleaved: round r runs one cycle (cycle r) of every side in turn (the order rotates), after
one warm-up cycle (cycle 0) each. The calls to `generate`, to the model's forward (outside
generate), to backward and to `optimizer.step` are counted with hooks in every process and
printed; a difference between the equal-work sides is reported loudly, and so is a row whose
length is not the one asked for (each side reports its rows' completion tokens). In the
realistic workload every side also reports how many groups scored all equal. Prints; asserts
nothing.

    make bench-trl [TRL_ARGS="--shapes tiny-dense,tiny-moe --rounds 3"]   # builds .venv-trl
    OMP_NUM_THREADS=1 .venv-trl/bin/python benchmarks/vs_trl.py [--shapes tiny-dense,tiny-moe]
        [--rounds 5] [--sides gspo,trl,floor] [--workload fixed,realistic,quickstart]

Shapes: tiny-dense and tiny-moe (the built-in models, fixed L=32) and dense-103m (a Qwen3 of
103M parameters with Qwen's 151,936-token vocabulary and a WordLevel tokenizer, built offline
from a config, fixed L=64; 65 to 100 s a cycle per side on one CPU thread, about 11 minutes for
`--shapes dense-103m --rounds 1`). Prompts are 16 tokens (quickstart: its own), the same 8 on
every side. TRL's
timing starts at the first update's `on_step_begin` (its generation is inside) and stops at
the fourth's `on_step_end`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, TextIO

# cycle, quickstart_workload and realistic_workload are modules of benchmarks/, beside this
import quickstart_workload
import torch
from cycle import MINIBATCHES, PROMPT_TOKENS, PROMPTS, ROWS, SAMPLES
from realistic_workload import (
    AT_CAP,
    CAP,
    MEDIAN,
    MIN_LENGTH,
    SIGMA,
    RealisticLengths,
    canonical_order,
    canonical_rows,
    drawn_lengths,
    drawn_rewards,
    flat_groups,
    no_signal_groups,
)
from rich.console import Console
from rich.table import Table
from torch.optim.optimizer import register_optimizer_step_post_hook

LR, CLIP_LOW, CLIP_HIGH, MAX_GRAD_NORM = 1e-6, 3e-4, 4e-4, 1.0  # gspo-cli's GSPO defaults
SIDES = ("gspo", "gspo-defaults", "trl", "floor")
WORKLOADS = ("fixed", "realistic", "quickstart")
EQUAL_WORK = ("gspo", "trl", "floor")
BASES = ("trl", "floor")  # the ratio columns
LABELS = {
    "gspo": "gspo-cli",
    "gspo-defaults": "gspo-cli, defaults (not equal work)",
    "trl": "TRL GRPOTrainer",
    "floor": "floor (plain torch)",
}
REALISTIC_LABELS = {
    **LABELS,
    "gspo-defaults": "gspo-cli, defaults (LESS work: no-signal rows skipped, prompts run once)",
}


@dataclass(frozen=True)
class Shape:
    model: str
    length: int  # new tokens per response in the fixed workload
    about: str


SHAPES = {
    "tiny-dense": Shape("builtin:tiny-dense", 32, "builtin:tiny-dense"),
    "tiny-moe": Shape("builtin:tiny-moe", 32, "builtin:tiny-moe"),
    "dense-103m": Shape("dense-103m", 64, "Qwen3 dense 103M, vocab 151,936"),
}


# --- models, prompts and rewards (identical in every process) -------------------------------


def _word_tokenizer(vocab_size: int) -> Any:
    """A WordLevel tokenizer of `vocab_size` entries (Qwen's vocabulary size), offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gspo_cli.models.tokenizer import EOS, IM_END, IM_START, PAD, SPECIAL_TOKENS, UNK

    words = [f"w{i}" for i in range(vocab_size - len(SPECIAL_TOKENS))]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=UNK,
        additional_special_tokens=[EOS, IM_START],
    )
    tokenizer.padding_side = "left"
    return tokenizer


def build(shape: Shape, workload: str) -> tuple[Any, Any]:
    """The shape's model (seed 0: the same weights in every process) and tokenizer; the
    quickstart's cold-started checkpoint for that workload."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gspo_cli.models import create_builtin

    if workload == "quickstart":
        return quickstart_workload.load()
    if shape.model.startswith("builtin:"):
        model, tokenizer = create_builtin(shape.model.removeprefix("builtin:"), seed=0)
    else:
        tokenizer = _word_tokenizer(151_936)
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            pad_token_id=int(tokenizer.pad_token_id),
            eos_token_id=int(tokenizer.eos_token_id),
            bos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_start|>")),
        )
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = Qwen3ForCausalLM(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.float().train(), tokenizer


def workload_prompts(tokenizer: Any, workload: str) -> tuple[list[str], list[str] | None]:
    """The 8 prompts, and their gold answers where the reward reads them (quickstart)."""
    if workload != "quickstart":
        return prompt_texts(tokenizer), None
    pairs = quickstart_workload.prompts(tokenizer, PROMPTS)
    return [text for text, _ in pairs], [answer for _, answer in pairs]


def prompt_texts(tokenizer: Any) -> list[str]:
    """8 prompts of exactly PROMPT_TOKENS tokens each (no padding anywhere)."""
    gen = torch.Generator().manual_seed(1)
    if len(tokenizer) > 1000:  # the word-level vocabulary
        ids = torch.randint(0, 100_000, (PROMPTS, PROMPT_TOKENS), generator=gen)
        texts = [" ".join(f"w{int(i)}" for i in row) for row in ids]
    else:
        letters = "abcdefghijklmnopqrstuvwxyz"
        ids = torch.randint(0, len(letters), (PROMPTS, PROMPT_TOKENS), generator=gen)
        texts = ["".join(letters[int(i)] for i in row) for row in ids]
    assert all(len(tokenizer(t)["input_ids"]) == PROMPT_TOKENS for t in texts)
    return texts


def score(texts: list[str]) -> list[float]:
    """Cheap and deterministic: 1 for about a quarter of the texts (a group of 8 scores all 0
    about one time in ten: it carries no signal, which only the defaults row exploits)."""
    return [float(sum(map(ord, t)) % 4 == 0) for t in texts]


def suppress_eos(tokenizer: Any) -> Any:
    from transformers import SuppressTokensLogitsProcessor

    return SuppressTokensLogitsProcessor([int(tokenizer.eos_token_id)])


def max_new_tokens(shape: Shape, workload: str) -> int:
    return shape.length if workload == "fixed" else CAP  # CAP: the quickstart's too


def length_processor(tokenizer: Any, workload: str) -> Any:
    """The one processor that sets the lengths: end-of-turn suppressed (fixed), the drawn
    lengths (realistic; stateful, so a process makes exactly one), or none (quickstart)."""
    if workload == "quickstart":
        return None
    if workload == "fixed":
        return suppress_eos(tokenizer)
    prompt_ids = [tokenizer(text)["input_ids"] for text in prompt_texts(tokenizer)]
    return RealisticLengths(int(tokenizer.eos_token_id), prompt_ids)


def expected_lengths(shape: Shape, workload: str, cycle: int) -> list[int] | None:
    """The lengths asked for; None where the model chooses them (quickstart)."""
    if workload == "quickstart":
        return None
    return [shape.length] * ROWS if workload == "fixed" else drawn_lengths(cycle)


class Rewards:
    """A side's reward function, called once per cycle with the batch's texts and each row's
    prompt index: `score` of the text (fixed), drawn_rewards of the canonical rows (realistic:
    the same rewards on every side, whatever the texts), or the maths verifier against the
    prompt's gold answer (quickstart). Keeps what the parent checks."""

    def __init__(self, workload: str, answers: list[str] | None = None) -> None:
        self.workload = workload
        self.answers = answers
        self.cycle = -1
        self.no_signal = 0  # groups that scored all equal, last cycle

    def __call__(self, texts: list[str], prompts: list[int]) -> list[float]:
        self.cycle += 1
        if self.workload == "fixed":
            scores = score(texts)
        elif self.answers is not None:
            scores = quickstart_workload.score(texts, [self.answers[p] for p in prompts])
        else:
            drawn = drawn_rewards(self.cycle)
            scores = [drawn[r] for r in canonical_rows(prompts)]
        self.no_signal = flat_groups(prompts, scores)
        return scores

    def result(self, prompts: list[int], lengths: list[int]) -> dict[str, Any]:
        """What a side reports of a cycle's batch (lengths in canonical order)."""
        return {
            "tokens": sum(lengths),
            "lengths": canonical_order(prompts, lengths),
            "no_signal": self.no_signal,
        }


# --- call counting ---------------------------------------------------------------------------


class Calls:
    """Counts `generate`, backbone forwards (inside generate apart), backward passes and
    optimizer steps of `model`, with hooks that every side goes through. `processor`, when set,
    is appended to every `generate`'s logits processors (how TRL gets the realistic lengths)."""

    def __init__(self, model: Any) -> None:
        self.counts: Counter[str] = Counter()
        self.generating = False
        self.processor: Any = None
        cls = type(model)
        cls.generate = self.counted(cls.generate)  # TRL patches the instance's forward only
        model.base_model.register_forward_hook(self._forward)  # TRL's fused head calls it too
        model.base_model.norm.weight.register_hook(self._backward)  # once per backward
        register_optimizer_step_post_hook(self._step)

    def counted(self, generate: Any) -> Any:
        """`generate`, or gspo-cli's own decoding loop (it drops finished rows), counted as one
        generate call whose forwards are decode steps."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.counts["generate"] += 1
            if self.processor is not None:
                from transformers import LogitsProcessorList

                own = kwargs.get("logits_processor") or []
                kwargs["logits_processor"] = LogitsProcessorList([*own, self.processor])
            self.generating = True
            try:
                return generate(*args, **kwargs)
            finally:
                self.generating = False

        return wrapper

    def _forward(self, module: Any, args: Any, output: Any) -> None:
        if self.generating:
            self.counts["decode steps"] += 1
            self.counts["decoded rows"] += output.last_hidden_state.shape[0]
        else:
            self.counts["forward"] += 1
            self.counts["forward tokens"] += output.last_hidden_state.shape[:2].numel()

    def _backward(self, grad: torch.Tensor) -> None:
        self.counts["backward"] += 1

    def _step(self, *_: Any) -> None:
        self.counts["optimizer.step"] += 1

    def take(self) -> dict[str, int]:
        out = dict(self.counts)
        self.counts.clear()
        return out


# --- the sides, each in its own process ------------------------------------------------------


class Channel:
    """Commands from the parent on stdin; results to the parent on the original stdout (every
    other print of the process, C level included, goes to stderr)."""

    def __init__(self) -> None:
        self.out: TextIO = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **message: Any) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def wait(self) -> None:
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(0)


class GspoSide:
    def __init__(self, model: Any, tokenizer: Any, shape: Shape, workload: str, skip: bool) -> None:
        from gspo_cli.recipe import Recipe
        from gspo_cli.rollout import SamplingParams
        from gspo_cli.rollout.hf import HFGenerateEngine
        from gspo_cli.train.distributed import LOCAL
        from gspo_cli.train.engine import TorchEngine
        from gspo_cli.train.replay import StepRouting
        from gspo_cli.train.step import StepSettings

        lengths = length_processor(tokenizer, workload)

        class FixedLength(HFGenerateEngine):
            def _processors(self, *args: Any) -> Any:
                processors = super()._processors(*args)
                if lengths is not None:
                    processors.append(lengths)
                return processors

        recipe = Recipe.model_validate(
            {
                "algorithm": {"name": "gspo", "minibatches": MINIBATCHES},
                "optimizer": {"lr": LR, "max_grad_norm": MAX_GRAD_NORM},
                "trainer": {"share_prompts": skip},  # equal work: a prompt per response
            }
        )
        params = SamplingParams(
            temperature=1.0, max_new_tokens=max_new_tokens(shape, workload), num_samples=SAMPLES
        )
        pad = int(tokenizer.pad_token_id)
        self.settings = StepSettings(recipe.algorithm, params, 0, False, pad)
        self.settings.skip_zero_advantage = skip
        if not skip:  # equal work: no MoE volatility probe (one extra forward per update)
            StepRouting.after_update = lambda *_: None  # type: ignore[method-assign]
        self.engine = TorchEngine(model, recipe, LOCAL)
        self.rollout = FixedLength(model, tokenizer)
        texts, answers = workload_prompts(tokenizer, workload)
        self.prompts = [tokenizer(t)["input_ids"] for t in texts]
        self.rewards = Rewards(workload, answers)
        self.cycles = 0

    def cycle(self) -> dict[str, Any]:
        from gspo_cli.train.rewards import RewardScores
        from gspo_cli.train.step import rl_step

        def reward(texts: list[str], rows: list[Any], completion_ids: Any) -> RewardScores:
            scores = self.rewards(texts, [row["prompt"] for row in rows])
            return RewardScores(scores, scores, {})

        rows = [{"prompt": i} for i in range(PROMPTS)]  # rl_step repeats them per sample
        step, self.cycles = self.cycles, self.cycles + 1
        out = rl_step(self.engine, self.rollout, reward, self.prompts, rows, self.settings, step)
        prompts = [i for i in range(PROMPTS) for _ in range(SAMPLES)]  # the rollout's order
        return self.rewards.result(prompts, [len(c) for c in out.rollout.completion_ids])


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
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
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
        model, tokenizer = self.model, self.tokenizer
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
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return self.rewards.result(prompts, lengths.tolist())


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
        )
        trainer.train()


def worker(side: str, shape: Shape, workload: str, cycles: int) -> None:
    chan = Channel()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = build(shape, workload)
    calls = Calls(model)
    chan.send(ready=True, parameters=sum(p.numel() for p in model.parameters()))
    if side == "trl":
        run_trl(model, tokenizer, shape, workload, cycles, chan, calls)
    else:
        runner: GspoSide | FloorSide = (
            FloorSide(model, tokenizer, shape, workload)
            if side == "floor"
            else GspoSide(model, tokenizer, shape, workload, skip=side == "gspo-defaults")
        )
        if side != "floor":
            from gspo_cli.rollout import hf

            hf.decode_dropping_finished = calls.counted(hf.decode_dropping_finished)
        for _ in range(cycles):
            chan.wait()
            calls.take()
            start = time.perf_counter()
            result = runner.cycle()
            chan.send(seconds=time.perf_counter() - start, **result, calls=calls.take())
    chan.wait()  # the parent's last word, after every side's cycles
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    chan.send(peak_rss_mb=peak)


# --- the parent: interleaved rounds, tables --------------------------------------------------


class Side:
    def __init__(self, name: str, shape: str, workload: str, cycles: int, logs: str) -> None:
        self.name = name
        self.log_path = os.path.join(logs, f"{shape}-{workload}-{name}.log")
        self.log = open(self.log_path, "w")  # noqa: SIM115 - open for the process's life
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, os.path.abspath(__file__), "--worker", name]
        self.proc = subprocess.Popen(
            [*command, "--shapes", shape, "--workload", workload, "--cycles", str(cycles)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.log.flush()
            with open(self.log_path) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"{self.name} died (log {self.log_path}):\n{tail}")
        return dict(json.loads(line))

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.receive()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def _ratio(values: list[float], base: list[float]) -> str:
    """The median of the paired (same round) ratios."""
    return f"{statistics.median(a / b for a, b in zip(values, base, strict=True)):.2f}x"


def _calls(c: dict[str, int], tokens: bool = True, steps: bool = True) -> str:
    """generate/forward/backward/step counts, with forwarded tokens and decode steps."""
    keys = ("generate", "forward", "backward", "optimizer.step")
    counts = "/".join(str(c.get(k, 0)) for k in keys)
    forwarded = f"{c.get('forward tokens', 0)}; " if tokens else ""
    return f"{counts} ({forwarded}{c.get('decode steps', 0) if steps else '-'})"


def _about(shape: Shape, workload: str) -> str:
    if workload == "fixed":
        return f"{shape.about}, L={shape.length}"
    if workload == "quickstart":
        return (
            f"{shape.about} after the quickstart's cold start, its prompts and maths verifier, "
            f"lengths as sampled (at most {CAP})"
        )
    return (
        f"{shape.about}, realistic lengths: lognormal median {MEDIAN} sigma {SIGMA} "
        f"in [{MIN_LENGTH}, {CAP - 1}] + {AT_CAP} rows at cap {CAP}"
    )


def measure(
    name: str, workload: str, sides: list[str], rounds: int, console: Console, logs: str
) -> None:
    shape = SHAPES[name]
    about = _about(shape, workload)
    console.rule(f"shape {name}, {workload} workload: {about}; {rounds} round(s) after a warm-up")
    started = time.perf_counter()
    procs = {s: Side(s, name, workload, rounds + 1, logs) for s in sides}
    try:
        params = {s: p.receive()["parameters"] for s, p in procs.items()}
        console.print(f"{params[sides[0]] / 1e6:.1f}M parameters; sides: {', '.join(sides)}")
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for r in range(rounds + 1):  # round 0 warms up
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            done = {s: procs[s].go() for s in order}
            for s in sides if r else ():
                results[s].append(done[s])
            seconds = ", ".join(f"{s} {done[s]['seconds']:.2f}s" for s in order)
            console.print(f"{f'round {r}' if r else 'warm-up'}: {seconds}", highlight=False)
        peaks = {s: p.go()["peak_rss_mb"] for s, p in procs.items()}
    finally:
        for p in procs.values():
            p.close()
    _report(name, shape, workload, sides, results, peaks, rounds, console)
    console.print(f"shape {name}, {workload} workload, took {time.perf_counter() - started:.0f}s")


def _report(
    name: str,
    shape: Shape,
    workload: str,
    sides: list[str],
    results: dict[str, list[dict[str, Any]]],
    peaks: dict[str, float],
    rounds: int,
    console: Console,
) -> None:
    seconds = {s: [x["seconds"] for x in results[s]] for s in sides}
    title = (
        f"{name} ({_about(shape, workload)}), {PROMPTS}x{SAMPLES} responses, {MINIBATCHES} "
        f"updates; median of {rounds} interleaved round(s); torch {torch.__version__}, 1 thread "
        f"per side, {platform.processor() or platform.machine()}"
    )
    labels = LABELS if workload == "fixed" else REALISTIC_LABELS
    table = Table(title=title)
    columns = ["side", "s/cycle", "completion tok/s", "peak RSS MB", "vs TRL", "vs floor"]
    for col in [*columns, "calls: generate/forward/backward/step (forward tokens; decode steps)"]:
        table.add_column(col, justify="right")
    for s in sides:
        median = statistics.median(seconds[s])
        tokens = statistics.median(x["tokens"] for x in results[s])
        ratios = [_ratio(seconds[s], seconds[base]) if base in sides else "-" for base in BASES]
        calls = {_calls(x["calls"]) for x in results[s]}
        table.add_row(
            labels[s],
            f"{median:.3f}",
            f"{tokens / median:.0f}",
            f"{peaks[s]:.0f}",
            *ratios,
            " | ".join(sorted(calls)),
        )
    console.print(table)
    if workload == "quickstart":
        _print_sampled(sides, results, console)
    else:
        _check_lengths(shape, workload, sides, results, console)
    _check_calls(workload, sides, results, console)
    if workload != "fixed":
        _print_no_signal(workload, sides, results, console)


def _check_lengths(
    shape: Shape,
    workload: str,
    sides: list[str],
    results: dict[str, list[dict[str, Any]]],
    console: Console,
) -> None:
    """Every side's rows of cycle c (round c) have exactly the lengths asked for."""
    expected = [
        expected_lengths(shape, workload, cycle) for cycle in range(1, len(results[sides[0]]) + 1)
    ]
    wrong = [
        s
        for s in sides
        if [x["lengths"] for x in results[s]] != expected
        or [x["tokens"] for x in results[s]] != [sum(e) for e in expected]
    ]
    totals = ", ".join(str(sum(e)) for e in expected)
    if wrong:
        console.print(f"[bold red]!!! completion lengths differ from those asked for: {wrong}[/]")
    else:
        console.print(f"completion lengths as asked on every side; tokens per cycle: {totals}")
    if workload == "realistic":
        for cycle, lengths in enumerate(expected, 1):
            below = [n for n in lengths if n < CAP]
            console.print(
                f"cycle {cycle}: mean length {statistics.mean(lengths):.1f}, median "
                f"{statistics.median(lengths)}, longest below the cap {max(below)}, "
                f"{len(lengths) - len(below)} at the cap {CAP}",
                highlight=False,
            )


def _check_calls(
    workload: str, sides: list[str], results: dict[str, list[dict[str, Any]]], console: Console
) -> None:
    """The equal-work sides make the same calls. With uneven lengths the forwarded tokens
    legitimately differ (padding to the batch's longest vs each micro-batch's): printed only;
    so do the decode steps where each side samples its own lengths (quickstart)."""
    tokens, steps = workload == "fixed", workload != "quickstart"
    per_side = {
        s: {_calls(x["calls"], tokens, steps) for x in results[s]} for s in sides if s in EQUAL_WORK
    }
    if len({frozenset(v) for v in per_side.values()}) > 1 or any(
        len(v) > 1 for v in per_side.values()
    ):
        console.print(f"[bold red]!!! THE EQUAL-WORK SIDES MADE DIFFERENT CALLS: {per_side}[/]")
    else:
        console.print(f"calls equal on {', '.join(per_side)}: {next(iter(per_side.values()))}")
    if not tokens:
        forwarded = ", ".join(
            f"{s} {'/'.join(str(x['calls'].get('forward tokens', 0)) for x in results[s])}"
            for s in sides
        )
        console.print(f"forward tokens per cycle (information): {forwarded}", highlight=False)
    decoded = ", ".join(
        f"{s} {'/'.join(str(x['calls'].get('decoded rows', 0)) for x in results[s])}" for s in sides
    )
    console.print(
        f"rows computed over all decode steps per cycle (information; gspo-cli drops a row at "
        f"its end-of-turn, `generate` computes every row to the longest): {decoded}",
        highlight=False,
    )


def _print_sampled(
    sides: list[str], results: dict[str, list[dict[str, Any]]], console: Console
) -> None:
    """Each side samples its own responses (quickstart): their lengths, per cycle."""
    for s in sides:
        cycles = [x["lengths"] for x in results[s]]
        stats = ", ".join(f"mean {statistics.mean(c):.1f} max {max(c)}" for c in cycles)
        console.print(f"sampled lengths per cycle, {s}: {stats}", highlight=False)


def _print_no_signal(
    workload: str, sides: list[str], results: dict[str, list[dict[str, Any]]], console: Console
) -> None:
    """The share of groups that scored all equal, as each side measured it, per cycle (and,
    where they were drawn, a flag if they are not the drawn ones)."""
    drawn = [no_signal_groups(cycle) for cycle in range(1, len(results[sides[0]]) + 1)]
    for s in sides:
        measured = [x["no_signal"] for x in results[s]]
        shares = ", ".join(f"{n}/{PROMPTS}" for n in measured)
        wrong = workload == "realistic" and measured != drawn
        flag = " [bold red]!!! not as drawn[/]" if wrong else ""
        console.print(f"no-signal groups per cycle, {s}: {shares}{flag}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated")
    parser.add_argument(
        "--workload",
        default="fixed",
        help="fixed, realistic, quickstart (tiny-dense only), comma-separated",
    )
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, SHAPES[args.shapes], args.workload, args.cycles)
        return
    console = Console(width=160)
    workloads = [w for w in args.workload.split(",") if w]
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"unknown workload(s) {sorted(unknown)}: choose from {WORKLOADS}")
    sides = [s for s in args.sides.split(",") if s]
    if "trl" in sides and importlib.util.find_spec("trl") is None:
        console.print(
            "[bold red]TRL is not installed here: `make bench-trl` runs this script in "
            ".venv-trl; going on without the TRL side[/]"
        )
        sides.remove("trl")
    if os.environ.get("OMP_NUM_THREADS") != "1":
        console.print("note: the sides run with OMP_NUM_THREADS=1 whatever this shell says")
    with tempfile.TemporaryDirectory(prefix="vs_trl-") as logs:
        if "quickstart" in workloads:
            console.rule("the quickstart's cold start (gspo sft recipes/quickstart.yaml)")
            os.environ[quickstart_workload.MODEL_ENV] = quickstart_workload.cold_start(logs)
        for workload in workloads:
            for name in args.shapes.split(","):
                if workload == "quickstart" and name != "tiny-dense":
                    console.print(f"the quickstart workload is tiny-dense's: {name} left out")
                    continue
                measure(name, workload, sides, args.rounds, console, logs)


if __name__ == "__main__":
    main()
