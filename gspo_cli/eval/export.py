"""`gspo export RUN_OR_CHECKPOINT OUT`: a plain HF checkpoint that transformers loads alone.

- A LoRA run's checkpoint: its base model (as the run held it, in the run's dtype) with the
  adapters merged into the weights in float32 (peft's merge_and_unload; `load_policy` says
  why), saved in float32 with the tokenizer: what `gspo eval` of the run scores, bit for bit.
- A full fine-tune's checkpoint (or a run's cold start): its HF files copied as they are,
  without the trainer's state (`*.pt`: optimizer, RNG, sampler; DeepSpeed's folder).

OUT must be new or an empty folder. A new OUT is written under a staging name beside it and
renamed into place, so a kill or a full disk never leaves a half-written export under that name.
An empty existing OUT is kept (it may be a mount point, such as Docker's `-v out:/out`, which
cannot be renamed or removed): the files are written in a staging folder inside it and each is
renamed into it, config.json last, so that a folder without config.json is never taken for a
finished export. Exported files get the usual modes (0644 under the usual umask).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gspo_cli.core.errors import GspoError
from gspo_cli.eval.checkpoints import run_dtype
from gspo_cli.models import load_policy
from gspo_cli.models.loading import convert_first, quiet_deepspeed_on_cpu
from gspo_cli.models.lora import is_adapter_folder
from gspo_cli.models.run_checkpoints import resolve_checkpoint
from gspo_cli.runs.folder import HF_CONFIG, remove_partial, staging
from gspo_cli.runs.marker import is_run_folder
from gspo_cli.runs.retention import best_checkpoint

TRAINER_FILES = ".pt"  # the suffix of every file of trainer state in a checkpoint


def export_checkpoint(name: str, out: Path, best: bool = False) -> Path:
    """Write the plain HF checkpoint of `name` (a run folder: its latest checkpoint, or with
    `best` its best by the run's trainer.best_metric) to `out`; returns the checkpoint folder
    it came from."""
    if best and not is_run_folder(Path(name).expanduser()):
        raise GspoError(f"export --best: {name} is not a run folder")
    source = best_checkpoint(Path(name)) if best else Path(resolve_checkpoint(name))
    if not source.is_dir():
        raise GspoError(f"export: {name} is not a checkpoint folder or run folder")
    if out.exists() and (not out.is_dir() or _has_files(out)):
        raise GspoError(f"export: {out} exists and is not empty; name a new or empty folder")
    convert_first(str(source), what="export")  # a replaced GGUF base: before any folder is made
    keep = out.is_dir()  # an empty folder (perhaps a mount point) is written into, not replaced
    where = out if keep else out.parent
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / staging(out.name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if is_adapter_folder(source):
            _write_merged(source, tmp)
        else:
            _copy_hf_files(source, tmp)
        _usual_modes(tmp)
        if keep:
            _move_files_into(tmp, out)
        else:
            tmp.rename(out)
    except BaseException as exc:
        problem = remove_partial(tmp, exc, where)
        if problem is None:
            raise
        raise GspoError(f"{problem}: nothing exported") from None
    return source


def _has_files(out: Path) -> bool:
    """Whether `out` holds anything but what a killed export left in it (its staging folder)."""
    return any(p.name != staging(out.name) for p in out.iterdir())


def _usual_modes(folder: Path) -> None:
    """0666/0777 less the umask, as a plain open or mkdir gives: the writers' temporary files
    (safetensors') come out 0600, and mkdtemp's 0700, which would keep others out of a model."""
    mask = _umask()
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _umask() -> int:
    mask = os.umask(0o022)  # reading it means setting it: put it straight back
    os.umask(mask)
    return mask


def _move_files_into(tmp: Path, out: Path) -> None:
    """Rename every file of `tmp` into `out` (same file system: each rename is atomic),
    config.json last, then remove `tmp`."""
    names = sorted(p.name for p in tmp.iterdir())
    for name in sorted(names, key=lambda n: n == HF_CONFIG):
        os.replace(tmp / name, out / name)
    tmp.rmdir()


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
