"""The run-folder contract: every file name that train, eval and compare share, and how to write
and read them safely. No other module spells these names.

A training run folder (`gspo train`, `gspo sft`; default `trainer.out_dir/<recipe name>`):

    recipe.yaml        the resolved recipe; `--resume` checks it against the new one
    metrics.jsonl      one record per RL step: {"step": N, ...}; NaN/inf written as strings
    samples.jsonl      a few completions per step (`logging.log_samples`)
    eval.jsonl         held-out accuracy: {"step": N, "accuracy": ...}; step 0 = before RL
    summary.json       {"steps": N, "heldout_accuracy": {"<step>": ...}}, written at the end
    cold_start/        the cold-start SFT result, an HF checkpoint (config.json, weights, tokenizer)
    lora_base/         with LoRA on a built-in model and no cold start: the seeded base model
                       the adapters sit on (an HF checkpoint), saved once
    checkpoints/
        step_NNNNNN/   HF weights + tokenizer, trainer_state.pt (step, sampler, RNG, world,
                       rollbacks) and the engine's state (optimizer.pt, or deepspeed/); with
                       LoRA, peft's adapter_config.json + adapter_model.safetensors instead of
                       the HF weights (the base is named in adapter_config.json), and when
                       the base is a GGUF file or a local folder, gguf_base.json: its path and
                       SHA-256 (a folder's: of its weights and config.json), checked
                       whenever the adapters are loaded on it (eval, export, resume)
        latest         text file: the name of the newest complete step_NNNNNN folder
    wandb/             wandb's own files, when `logging.wandb` is on
    wandb_run_id       the wandb run's id, which a resumed run continues
    .gspo.lock         held (flock) by the one process writing the folder; says who: pid, host
    .gspo-run          the run marker: {"kind": "run"}, written when the folder is created;
                       a folder without it that is not empty is never written to (run_marker.py)

Folders (cold_start/, step_NNNNNN/) are written under a hidden `.<name>.tmp` staging name and
renamed into place; files are appended with fsync (JSONL) or replaced atomically (the rest), so a
kill at any moment leaves the previous state readable. On resume, JSONL records of steps after the
restored checkpoint are dropped. A folder has one writer at a time (runs/lock.py).

An eval output folder (`gspo eval`; default `evals/<benchmark>`; a run folder may hold them as
`eval/` or `eval/<benchmark>/`, and `gspo compare` reads `results.json` from all three places):

    settings.json      the evaluation settings; `--resume` requires them unchanged
    samples.jsonl      one record per finished problem (appended, so a rerun skips it)
    results.json       the metrics with intervals, written at the end
    .gspo.lock         as in a training run folder
    .gspo-run          the run marker: {"kind": "eval"}

A comparison folder (`gspo compare`; default `comparisons/latest`): summary.json, summary.md and
one `<metric>.png` per plot.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gspo_cli.core.errors import GspoError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Training run folder.
RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"  # also in an eval output folder
EVALS = "eval.jsonl"
JUDGE_CACHE = "judge_cache.jsonl"  # an LLM judge's parsed answers (rank 0; judge_cache.rankN.jsonl)
EVENTS = "events.jsonl"  # guard events (non-finite stop, collapse warn/stop/rollback); never cut
SUMMARY = "summary.json"  # also in a comparison folder
COLD_START = "cold_start"
CHECKPOINTS = "checkpoints"
LATEST = "latest"  # inside checkpoints/
TRAINER_STATE = "trainer_state.pt"  # inside checkpoints/step_NNNNNN/
STEP_GLOB = "step_*"
HF_CONFIG = "config.json"  # what marks a folder as an HF checkpoint
ADAPTER_CONFIG = "adapter_config.json"  # what marks a folder as peft adapters (LoRA)
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's adapter weights, beside ADAPTER_CONFIG
GGUF_BASE = "gguf_base.json"  # beside ADAPTER_CONFIG: a GGUF or folder base's path and SHA-256
TEACHER_FILES = "teacher.json"  # a distillation teacher's path and its files' SHA-256, at the start
LORA_BASE = "lora_base"  # a LoRA run's saved built-in base model (no cold start)
WANDB_ID = "wandb_run_id"

LOCK = ".gspo.lock"  # also in an eval output folder
RUN_MARKER = ".gspo-run"  # says a folder is ours, and what kind: also in an eval output folder

# Eval output folder.
SETTINGS = "settings.json"
RESULTS = "results.json"
EVAL_DIR = "eval"  # where a run folder keeps its eval outputs

# Comparison folder.
SUMMARY_MD = "summary.md"


# A failed write with less than this left on its file system is reported as a full disk: some
# writers (torch.save) lose the errno.
LOW_SPACE_BYTES = 4 * 2**20


def step_folder(step: int) -> str:
    """`step_NNNNNN`: zero-padded, so that names sort in step order."""
    return f"step_{step:06d}"


def judge_cache_file(rank: int) -> str:
    """Each process appends its own judge cache: one writer per file."""
    return JUDGE_CACHE if rank == 0 else JUDGE_CACHE.replace(".jsonl", f".rank{rank}.jsonl")


def staging(name: str) -> str:
    """The hidden name a folder is written under before it is renamed to `name`."""
    return f".{name}.tmp"


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line, flushed and fsynced: a kill loses at most the line being written.

    Strict JSON (no NaN/inf): callers turn non-finite numbers into strings first.
    """
    line = json.dumps(record, allow_nan=False)
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # a line a kill cut short: end it, so it stays on its own
                line = "\n" + line
        f.write((line + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(1-based line number, object) per non-blank line; None for a line that is not a JSON object.

    Such a line is usually the last one, cut by a kill mid-append; callers skip it (and may report
    it by number). Undecodable bytes are replaced rather than fatal, for the same reason.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        yield number, obj if isinstance(obj, dict) else None


def saved_recipe_section(run_dir: Path, name: str) -> dict[str, Any]:
    """Section `name` of the run's saved recipe.yaml; {} when it cannot be read."""
    try:
        saved = yaml.safe_load((run_dir / RECIPE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    section = saved.get(name) if isinstance(saved, dict) else None
    return section if isinstance(section, dict) else {}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file in order, skipping torn and blank lines; [] if absent."""
    if not path.is_file():
        return []
    return [obj for _, obj in iter_jsonl(path) if obj is not None]


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync it, then rename it over `path`.

    A kill mid-write leaves the old file (or none), never a truncated one. The file gets the
    mode a plain open would give (0644 under the usual umask).
    """
    fd, tmp = _new_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _new_temp_file(path: Path) -> tuple[int, str]:
    """A new hidden file beside `path`, opened for writing. Not tempfile.mkstemp: its files are
    0600 whatever the umask, and the rename would carry that mode to `path`."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # a name another writer drew: draw again
            continue


def write_text_atomic(path: Path, text: str) -> None:
    """`write_bytes_atomic` for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))


def run_dir_of(out_dir: str | Path, name: str, out: Path | None) -> Path:
    """A run's folder: --out, else trainer.out_dir/NAME (the recipe's `out_dir` and `name`)."""
    return out or Path(out_dir) / name


def has_progress(run_dir: Path) -> bool:
    """True once a run folder holds something a rerun would lose: a checkpoint, the cold start,
    metrics or evaluations. A folder a failed start left (a recipe.yaml) is not a run yet."""
    marks = (run_dir / CHECKPOINTS / LATEST, run_dir / COLD_START / HF_CONFIG)
    logs = (run_dir / METRICS, run_dir / EVALS)
    return any(p.is_file() for p in marks) or any(p.is_file() and p.stat().st_size for p in logs)


def check_run_folder(run_dir: Path, resume: bool) -> None:
    """The one-line refusals of a run folder: not a folder, or a run that needs --resume."""
    if run_dir.exists() and not run_dir.is_dir():
        raise GspoError(f"run folder {run_dir} is a file, not a folder: choose another --out")
    if not resume and run_dir.is_dir() and has_progress(run_dir):
        raise GspoError(
            f"run folder {run_dir} already exists: pass --resume to continue it, or --out"
        )


def _chain_says(exc: BaseException, errnos: tuple[int, ...], phrases: tuple[str, ...]) -> bool:
    """Whether an OSError with one of `errnos`, or a message with one of `phrases` (for writers
    that wrap the OSError, as safetensors' does), is in `exc`'s chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in errnos:
            return True
        if any(phrase in str(seen).lower() for phrase in phrases):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def out_of_space(exc: BaseException, path: Path) -> bool:
    """Whether `exc`, raised while writing under `path`, means the disk (or quota) is full:
    ENOSPC/EDQUOT in the exception chain or its message, or next to nothing left free (for
    writers that lose the errno). Check before removing the partial write."""
    if _chain_says(exc, (errno.ENOSPC, errno.EDQUOT), ("no space left", "quota exceeded")):
        return True
    try:
        return shutil.disk_usage(path).free < LOW_SPACE_BYTES
    except OSError:
        return False


def file_too_large(exc: BaseException) -> bool:
    """Whether `exc` is a write past the process's file size limit (`ulimit -f`): EFBIG, which
    Python gets instead of SIGXFSZ (it ignores that signal)."""
    return _chain_says(exc, (errno.EFBIG,), ("file too large",))


def write_error(exc: OSError, path: Path) -> GspoError:
    """A failed write under `path` as one line that names the problem and the place."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return GspoError(f"no space left on {path}")
    if exc.errno == errno.EFBIG:
        return GspoError(FILE_SIZE_LIMIT.format(path=path))
    if exc.errno == errno.EROFS:
        return GspoError(f"cannot write in {path}: read-only file system")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return GspoError(f"cannot write in {path}: permission denied")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return GspoError(f"cannot create folder {path}: a file is in the way")
    return GspoError(f"cannot write in {path}: {exc.strerror or exc}")


FILE_SIZE_LIMIT = "cannot write in {path}: a file reached the file size limit (ulimit -f)"


def remove_partial(tmp: Path, exc: BaseException, where: Path) -> GspoError | None:
    """Remove a staging folder a failed write left; the one-line error for a full disk, a file
    size limit (or a refused write), else None (re-raise the original). Disk-full is judged
    before the removal frees the space."""
    full = isinstance(exc, Exception) and out_of_space(exc, where)  # not for Ctrl-C
    shutil.rmtree(tmp, ignore_errors=True)
    if full:
        return GspoError(f"no space left on {where}")
    if isinstance(exc, Exception) and file_too_large(exc):
        return GspoError(FILE_SIZE_LIMIT.format(path=where))
    if isinstance(exc, OSError) and exc.errno:
        return write_error(exc, where)
    return None


def save_hf_folder(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    run_dir: Path,
    name: str,
    what: str,
) -> None:
    """`run_dir/name` as an HF checkpoint (`what`, for the error line), written under a staging
    name and renamed: a kill or a full disk leaves no half folder."""
    tmp = run_dir / staging(name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(run_dir / name)
    except BaseException as exc:
        problem = remove_partial(tmp, exc, run_dir)
        if problem is None:
            raise
        raise GspoError(f"{problem}: {what} was not saved") from None
