"""What a model path that names a run resolves to: `gspo eval RUN`, `gspo export RUN` and a
distillation teacher given as a run folder all take the run's latest checkpoint (with LoRA, its
adapters, which `load_policy` merges into their base model)."""

from __future__ import annotations

from pathlib import Path

from gspo_cli.core.errors import GspoError
from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX
from gspo_cli.models.gguf import GGUF_SUFFIX
from gspo_cli.runs.folder import ADAPTER_CONFIG, CHECKPOINTS, COLD_START, HF_CONFIG, LATEST, RECIPE
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
