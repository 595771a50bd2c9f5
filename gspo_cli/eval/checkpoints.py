"""Load what `gspo eval CHECKPOINT` (and `gspo export`) names, once resolved
(models/run_checkpoints.py): its model, and the dtype its run trained in."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.models import load_policy
from gspo_cli.models.lora import is_adapter_folder
from gspo_cli.runs.folder import CHECKPOINTS, saved_recipe_section


def run_dtype(checkpoint: Path) -> str:
    """The dtype the run of `checkpoint` trained in (its recipe.yaml's model.dtype): the base
    of its LoRA adapters is loaded in it, as the run held it; float32 when unknown."""
    if checkpoint.parent.name != CHECKPOINTS:
        return "float32"
    dtype = saved_recipe_section(checkpoint.parent.parent, "model").get("dtype")
    return dtype if dtype in ("float32", "bfloat16") else "float32"


def load_for_eval(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """What `gspo eval` scores, computed in float32. A LoRA checkpoint's base is loaded in the
    run's dtype and the adapters merged in float32, exactly as `gspo export` writes it:
    evaluating a run and evaluating its export see the very same weights."""
    local = Path(path).expanduser()
    dtype = run_dtype(local) if is_adapter_folder(local) else "float32"
    model, tokenizer = load_policy(path, dtype=dtype, what="checkpoint")
    return model.float(), tokenizer
