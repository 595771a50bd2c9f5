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
    OMP_NUM_THREADS=1 .venv-trl/bin/python benchmarks/vs_trl [--shapes tiny-dense,tiny-moe]
        [--rounds 5] [--sides gspo,trl,floor] [--workload fixed,realistic,quickstart]

Shapes: tiny-dense and tiny-moe (the built-in models, fixed L=32) and dense-103m (a Qwen3 of
103M parameters with Qwen's 151,936-token vocabulary and a WordLevel tokenizer, built offline
from a config, fixed L=64; 65 to 100 s a cycle per side on one CPU thread, about 11 minutes for
`--shapes dense-103m --rounds 1`), and the real model: smollm2-135m (SmolLM2-135M-Instruct,
`builtin:smollm2-135m`: its own byte-level BPE tokenizer, vocabulary 49,152; fixed L=48, the
max_new_tokens of recipes/real/) and smollm2-135m-lora (the same, every side training LoRA
adapters of rank 16, alpha 32 on all linear layers, as recipes/real/smollm2-arithmetic-lora.yaml:
gspo-cli through the recipe's `model.lora`, TRL through `peft_config`, the floor through peft's
`get_peft_model`). Its prompts are 16 real tokens, lower-case words of its vocabulary drawn at
random. Prompts are 16 tokens (quickstart: its own), the same 8 on every side. TRL's
timing starts at the first update's `on_step_begin` (its generation is inside) and stops at
the fourth's `on_step_end`.

The package (run as a folder: `__main__.py`): shapes.py (the models, prompts and the settings
every side shares), workloads.py (lengths and rewards), calls.py (the counting hooks),
gspo_side.py, floor_side.py and trl_side.py (one cycle of each side), worker.py (a side's
process), rounds.py (the parent: interleaved rounds), report.py (the tables and the checks),
cli.py (the options). Beside it in benchmarks/: cycle.py, realistic_workload.py and
quickstart_workload.py.
"""
