"""The models every side loads (seed 0: the same weights in every process), the prompts, and
the optimisation settings every side shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# quickstart_workload and cycle are modules of benchmarks/, beside this package
import quickstart_workload
import torch
from cycle import PROMPT_TOKENS, PROMPTS

LR, CLIP_LOW, CLIP_HIGH, MAX_GRAD_NORM = 1e-6, 3e-4, 4e-4, 1.0  # gspo-cli's GSPO defaults
# The LoRA shapes' adapters: those of recipes/real/smollm2-arithmetic-lora.yaml
LORA_R, LORA_ALPHA, LORA_TARGETS = 16, 32, "all-linear"


@dataclass(frozen=True)
class Shape:
    model: str
    length: int  # new tokens per response in the fixed workload
    about: str
    lora: bool = False  # every side trains LoRA adapters (LORA_*) on a frozen model


SMOLLM2 = "SmolLM2-135M-Instruct (builtin:smollm2-135m), vocab 49,152"
SHAPES = {
    "tiny-dense": Shape("builtin:tiny-dense", 32, "builtin:tiny-dense"),
    "tiny-moe": Shape("builtin:tiny-moe", 32, "builtin:tiny-moe"),
    "dense-103m": Shape("dense-103m", 64, "Qwen3 dense 103M, vocab 151,936"),
    # L=48: the max_new_tokens of recipes/real/smollm2-arithmetic*.yaml
    "smollm2-135m": Shape("builtin:smollm2-135m", 48, SMOLLM2),
    "smollm2-135m-lora": Shape(
        "builtin:smollm2-135m", 48, f"{SMOLLM2}, LoRA r {LORA_R} {LORA_TARGETS}", lora=True
    ),
}

# a plain `make bench-trl`: the SmolLM2 shapes take about 15 min a shape at 2 rounds
DEFAULT_SHAPES = ("tiny-dense", "tiny-moe", "dense-103m")


def peft_lora_config() -> Any:
    """The LoRA shapes' adapters as peft's config (TRL's `peft_config`, the floor's)."""
    from peft import LoraConfig

    return LoraConfig(
        r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )


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

    from gspo_cli.models import create_builtin, load_policy
    from gspo_cli.models.gguf import PRETRAINED_BUILTINS

    if workload == "quickstart":
        return quickstart_workload.load()
    if shape.model.removeprefix("builtin:") in PRETRAINED_BUILTINS:  # a real checkpoint
        model, tokenizer = load_policy(shape.model)
    elif shape.model.startswith("builtin:"):
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


def prompt_texts(tokenizer: Any) -> list[str]:
    """8 prompts of exactly PROMPT_TOKENS tokens each (no padding anywhere)."""
    gen = torch.Generator().manual_seed(1)
    if "w0" in tokenizer.get_vocab():  # the word-level vocabulary
        ids = torch.randint(0, 100_000, (PROMPTS, PROMPT_TOKENS), generator=gen)
        texts = [" ".join(f"w{int(i)}" for i in row) for row in ids]
    elif len(tokenizer) > 1000:  # a real BPE vocabulary
        texts = [_bpe_words(tokenizer, gen) for _ in range(PROMPTS)]
    else:
        letters = "abcdefghijklmnopqrstuvwxyz"
        ids = torch.randint(0, len(letters), (PROMPTS, PROMPT_TOKENS), generator=gen)
        texts = ["".join(letters[int(i)] for i in row) for row in ids]
    assert all(len(tokenizer(t)["input_ids"]) == PROMPT_TOKENS for t in texts)
    return texts


def _bpe_words(tokenizer: Any, gen: torch.Generator) -> str:
    """Lower-case words of a byte-level BPE vocabulary ("Ġword" entries) drawn at random and
    joined by spaces until the text is PROMPT_TOKENS tokens long: real tokens, no padding."""
    words = sorted(
        t[1:] for t in tokenizer.get_vocab() if t[:1] == "Ġ" and t[1:].isalpha() and t[1:].islower()
    )
    while True:
        text = ""
        while len(tokenizer(text)["input_ids"]) < PROMPT_TOKENS:
            word = words[int(torch.randint(len(words), (1,), generator=gen))]
            text = f"{text} {word}" if text else word.capitalize()
        if len(tokenizer(text)["input_ids"]) == PROMPT_TOKENS:  # else a word of 2+ tokens
            return text
