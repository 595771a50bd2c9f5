"""Resolve what `gspo eval CHECKPOINT` (and `gspo export`) names: an HF folder, a folder of LoRA
adapters, a GGUF file, a run folder, or a built-in model."""

from __future__ import annotations

from pathlib import Path

import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.models import load_policy
from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX
from gspo_cli.models.gguf import GGUF_SUFFIX
from gspo_cli.models.lora import is_adapter_folder
from gspo_cli.runs.folder import (
    ADAPTER_CONFIG,
    CHECKPOINTS,
    COLD_START,
    HF_CONFIG,
    LATEST,
    RECIPE,
)
from gspo_cli.runs.marker import RUN, folder_kind


def is_checkpoint(folder: Path) -> bool:
    """An HF checkpoint, or a LoRA run's checkpoint (adapters naming their base model)."""
    return (folder / HF_CONFIG).is_file() or (folder / ADAPTER_CONFIG).is_file()


def resolve_checkpoint(name: str) -> str:
    """A path or id that `load_policy` accepts: a run folder becomes its latest checkpoint
    (with LoRA, its adapters: `load_policy` merges them into their base model)."""
    if name.startswith(BUILTIN_MODEL_PREFIX):
        return name
    path = Path(name).expanduser()
    if not path.exists():
        if name.startswith(("/", ".", "~")) or name.count("/") != 1:
            raise GspoError(f"checkpoint not found: {name}")
        return name  # a hub id such as Qwen/Qwen3-8B, loaded if cached
    if is_checkpoint(path) or (path.is_file() and path.suffix == GGUF_SUFFIX):
        return str(path)
    pointer = path / CHECKPOINTS / LATEST
    if pointer.is_file():
        folder = path / CHECKPOINTS / pointer.read_text(encoding="utf-8").strip()
        if not is_checkpoint(folder):
            raise GspoError(f"{pointer} points to {folder}, which is not an HF checkpoint")
        return str(folder)
    if (path / COLD_START / HF_CONFIG).is_file():
        return str(path / COLD_START)
    if folder_kind(path) == RUN or (path / RECIPE).is_file():  # a run stopped before any save
        raise GspoError(
            f"{name} is a run folder with no checkpoint yet (no {CHECKPOINTS}/{LATEST} and no "
            f"{COLD_START}/): train it further, or name a checkpoint"
        )
    raise GspoError(
        f"{name} is neither an HF checkpoint (config.json), LoRA adapters "
        f"(adapter_config.json), a .gguf file nor a run folder"
    )


def run_dtype(checkpoint: Path) -> str:
    """The dtype the run of `checkpoint` trained in (its recipe.yaml's model.dtype): the base
    of its LoRA adapters is loaded in it, as the run held it; float32 when unknown."""
    recipe = checkpoint.parent.parent / RECIPE
    if checkpoint.parent.name != CHECKPOINTS or not recipe.is_file():
        return "float32"
    try:
        data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
        dtype = data["model"]["dtype"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return "float32"
    return dtype if dtype in ("float32", "bfloat16") else "float32"


def load_for_eval(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """What `gspo eval` scores, computed in float32. A LoRA checkpoint's base is loaded in the
    run's dtype and the adapters merged in float32, exactly as `gspo export` writes it:
    evaluating a run and evaluating its export see the very same weights."""
    local = Path(path).expanduser()
    dtype = run_dtype(local) if is_adapter_folder(local) else "float32"
    model, tokenizer = load_policy(path, dtype=dtype, what="checkpoint")
    return model.float(), tokenizer
