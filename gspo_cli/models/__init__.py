"""Models: HF checkpoints, built-in tiny models and their offline tokenizer."""

from gspo_cli.models.builtin import BUILTIN_MODELS, create_builtin
from gspo_cli.models.loading import DTYPES, load_policy, restore_weights
from gspo_cli.models.routing import is_moe
from gspo_cli.models.tokenizer import build_char_tokenizer

__all__ = [
    "BUILTIN_MODELS",
    "DTYPES",
    "build_char_tokenizer",
    "create_builtin",
    "is_moe",
    "load_policy",
    "restore_weights",
]
