"""A model's tokenizer alone, and whether two tokenizers map every id to the same token.

On-policy distillation scores the student's sampled ids with the teacher: that is only the
teacher's probability of the same text when both tokenizers give every id the same token. A
teacher with another vocabulary is refused before anything is written (`vocab_problem`).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX
from gspo_cli.models.loading import hf_path, hub_unavailable, is_gguf_path, not_in_cache
from gspo_cli.models.lora import adapter_base, is_adapter_folder
from gspo_cli.models.tokenizer import build_char_tokenizer

SHOWN_IDS = 3  # differing ids a refusal names


def load_tokenizer(path: str, *, what: str, hub: bool) -> PreTrainedTokenizerBase | None:
    """The tokenizer `load_policy(path)` would return, without the weights; None when it is a
    hub id and `hub` is False (validation does not download). A GGUF is converted first."""
    local = Path(path).expanduser()
    if path.startswith(("/", ".", "~")) and not local.exists():
        raise GspoError(f"{what}: no such folder: {path}")
    if is_adapter_folder(local):  # a LoRA checkpoint: its base's tokenizer, as load_policy
        return load_tokenizer(adapter_base(local), what=what, hub=hub)
    if path.startswith(BUILTIN_MODEL_PREFIX) and not is_gguf_path(path):
        return build_char_tokenizer()  # every seeded built-in shares it
    path = hf_path(path, what=what)
    local = Path(path).expanduser()
    if not local.exists() and not hub:
        return None
    no_hub = None if local.exists() else hub_unavailable()
    try:
        return AutoTokenizer.from_pretrained(
            str(local) if local.exists() else path, local_files_only=no_hub is not None
        )
    except (OSError, ValueError) as exc:
        if no_hub is not None:
            raise GspoError(not_in_cache(what, path, no_hub)) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GspoError(f"{what}: cannot load the tokenizer of {path!r}: {first}") from None


def id_to_token(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """Every id the tokenizer knows (added tokens included) and its token string."""
    return {int(i): str(token) for token, i in tokenizer.get_vocab().items()}


def vocab_problem(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, what: str
) -> str | None:
    """One line when some id maps to another token (or to none) in the two tokenizers: the
    sizes and the first differing ids with both tokens; None when they agree on every id."""
    ours, theirs = id_to_token(student), id_to_token(teacher)
    differ = sorted(i for i in ours.keys() | theirs.keys() if ours.get(i) != theirs.get(i))
    if not differ:
        return None
    shown = ", ".join(
        f"{i} ({ours.get(i, '<none>')!r} vs {theirs.get(i, '<none>')!r})"
        for i in differ[:SHOWN_IDS]
    )
    more = f" and {len(differ) - SHOWN_IDS} more" if len(differ) > SHOWN_IDS else ""
    return (
        f"{what}: its tokenizer differs from the student's ({len(ours)} vs {len(theirs)} "
        f"tokens; ids student vs teacher: {shown}{more}): the teacher must score the "
        "student's ids as the same tokens"
    )
