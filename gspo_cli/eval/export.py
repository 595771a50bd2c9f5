"""`gspo export RUN_OR_CHECKPOINT OUT`: a plain HF checkpoint that transformers loads alone.

- A LoRA run's checkpoint: its base model (as the run held it, in the run's dtype) with the
  adapters merged into the weights in float32 (peft's merge_and_unload; `load_policy` says
  why), saved in float32 with the tokenizer: what `gspo eval` of the run scores, bit for bit.
- A full fine-tune's checkpoint (or a run's cold start): its HF files copied as they are,
  without the trainer's state (`*.pt`: optimizer, RNG, sampler; DeepSpeed's folder).

OUT must be new or an empty folder. It is written under a staging name beside it and renamed
into place, so a kill or a full disk never leaves a half-written export under that name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gspo_cli.errors import GspoError
from gspo_cli.eval.checkpoints import resolve_checkpoint, run_dtype
from gspo_cli.models import load_policy
from gspo_cli.models.loading import convert_first, quiet_deepspeed_on_cpu
from gspo_cli.models.lora import is_adapter_folder
from gspo_cli.run_folder import remove_partial, staging

TRAINER_FILES = ".pt"  # the suffix of every file of trainer state in a checkpoint


def export_checkpoint(name: str, out: Path) -> Path:
    """Write the plain HF checkpoint of `name` (a run folder: its latest checkpoint) to `out`;
    returns the checkpoint folder it came from."""
    source = Path(resolve_checkpoint(name))
    if not source.is_dir():
        raise GspoError(f"export: {name} is not a checkpoint folder or run folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GspoError(f"export: {out} exists and is not empty; name a new or empty folder")
    convert_first(str(source), what="export")  # a replaced GGUF base: before any folder is made
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / staging(out.name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if is_adapter_folder(source):
            _write_merged(source, tmp)
        else:
            _copy_hf_files(source, tmp)
        tmp.rename(out)  # onto an empty folder too
    except BaseException as exc:
        problem = remove_partial(tmp, exc, out.parent)
        if problem is None:
            raise
        raise GspoError(f"{problem}: nothing exported") from None
    return source


def _write_merged(source: Path, folder: Path) -> None:
    model, tokenizer = load_policy(str(source), dtype=run_dtype(source), what="export")
    quiet_deepspeed_on_cpu(model.device)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _copy_hf_files(source: Path, folder: Path) -> None:
    folder.mkdir()
    for file in source.iterdir():
        if file.is_file() and file.suffix != TRAINER_FILES:
            shutil.copy2(file, folder / file.name)
