"""Load the policy: an HF checkpoint (folder or hub id) or a built-in tiny model."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from gspo_cli.errors import GspoError
from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX, create_builtin

hf_logging.disable_progress_bar()  # gspo's own display reports progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def disable_dropout(model: PreTrainedModel) -> PreTrainedModel:
    """Dropout off everywhere: with it, on-policy ratios are not 1 and GSPO's 3e-4 clip range
    would be hit by noise alone. (Rollouts run in eval mode, log-probs in train mode.)"""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "attn_dropout", "dropout_rate"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def load_policy(
    path: str,
    *,
    dtype: str = "float32",
    seed: int = 0,
    trust_remote_code: bool = False,
    what: str = "model.path",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and its tokenizer; a problem becomes one GspoError line naming `what` (the
    recipe key or argument) and the path."""
    if path.startswith(BUILTIN_MODEL_PREFIX):
        try:
            model, tokenizer = create_builtin(path.removeprefix(BUILTIN_MODEL_PREFIX), seed)
        except KeyError as exc:
            raise GspoError(f"{what}: {exc}") from None
        return disable_dropout(model.to(DTYPES[dtype])), tokenizer
    local = Path(path).expanduser()
    if path.startswith(("/", ".", "~")) and not local.exists():
        raise GspoError(f"{what}: no such folder: {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local) if local.exists() else path)
        model = AutoModelForCausalLM.from_pretrained(
            str(local) if local.exists() else path,
            dtype=DTYPES[dtype],
            trust_remote_code=trust_remote_code,
        )
    except SafetensorError as exc:  # a truncated or damaged weights file
        raise GspoError(f"{what}: the weights in {path} are damaged or truncated ({exc})") from None
    except (OSError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GspoError(f"{what}: cannot load {path!r}: {first}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return disable_dropout(model), tokenizer


def restore_weights(model: PreTrainedModel, folder: Path) -> None:
    """Load a checkpoint's HF weights into `model` in place (tied embeddings are saved once)."""
    from safetensors.torch import load_file

    try:
        weights = load_file(str(folder / "model.safetensors"))
    except Exception as exc:  # safetensors raises several types for a damaged file
        raise GspoError(f"checkpoint {folder / 'model.safetensors'} is corrupted: {exc}") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
        raise GspoError(f"checkpoint {folder} does not match the model: {missing or unexpected}")
    if missing:
        model.tie_weights()
