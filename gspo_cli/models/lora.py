"""LoRA adapters on a policy, through peft: the model stays frozen, low-rank updates train.

`Adapters.add` wraps a model with peft's `get_peft_model`. peft puts its LoRA layers into the HF
model in place, so the engines, the hand-written LM head, shared prompts and the decoding loop
keep working on that HF model (`Adapters.model`), while the peft wrapper does what is peft's:
switching the adapters off (`disabled`: the base model, the KL reference), saving and loading
them (`save_pretrained`, as `adapter_config.json` + `adapter_model.safetensors`), and merging
them (`merged_weights` for a rollout engine with weights of its own, `merge_adapters` for
evaluation and export). Which modules adapters may target is lora_targets.py's.

A folder of adapters names its base model in `adapter_config.json` (`base_model_name_or_path`):
a hub id, or the absolute path of a folder. `adapter_base` reads it back, and finds a base that
lived in a run folder moved since (the checkpoint's run folder holds it under the same name).
A GGUF base (a `.gguf` path, or a pretrained built-in) or a local folder is named, not copied,
so its SHA-256 (of the file; of a folder's weights and config) is saved beside the adapters
(GGUF_BASE, named for its first use) and `check_base_sha256` refuses a base changed since.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from gspo_cli.core.errors import GspoError
from gspo_cli.models.lora_targets import ADAPTER, target_problem
from gspo_cli.runs.folder import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CHECKPOINTS,
    GGUF_BASE,
    HF_CONFIG,
    write_text_atomic,
)

LORA_KEY = ".lora_"  # in the state-dict names of peft's LoRA parameters
# peft's wrapped layer in names, once or nested (a ParamWrapper per adapted parameter)
BASE_LAYER = re.compile(r"(\.base_layer)+(?=\.|$)")
TIED_WARNINGS = r"Model (has|with) `tie_word_embeddings=True`"  # peft's, on a tied target


class Adapters:
    """A model's LoRA adapters: the peft wrapper, beside the HF model (with peft's layers in
    it) that the engines train."""

    def __init__(self, wrapped: Any) -> None:
        self.peft = wrapped  # peft.PeftModel
        self.model: PreTrainedModel = wrapped.get_base_model()
        self.base_sha256: str | None = None  # of a GGUF or folder base: saved, checked on load

    @classmethod
    def add(
        cls,
        model: PreTrainedModel,
        *,
        r: int,
        alpha: float,
        dropout: float,
        targets: list[str] | str,
        label: str = "the model",
    ) -> Adapters:
        """Freeze `model` and give it fresh adapters (B = 0: it computes what it did)."""
        import peft

        problem = target_problem(model, targets, label)
        if problem is not None:
            raise GspoError(problem)
        config = peft.LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        try:
            with warnings.catch_warnings():
                # peft's own MoE conversion adds patterns for fused experts, then says they
                # matched nothing: no setting of the recipe's, nothing a user can act on
                warnings.filterwarnings("ignore", message=".*did not match any targeted module")
                wrapped = peft.get_peft_model(model, config)
        except ValueError as exc:  # e.g. a target that is no layer peft can adapt
            raise GspoError(f"model.lora: {_first_line(exc)}") from None
        if getattr(model, "is_gradient_checkpointing", False):
            model.enable_input_require_grads()  # the frozen embeddings give checkpoints no grad
        return cls(wrapped)

    def disabled(self) -> AbstractContextManager[None]:
        """Inside it, the model computes its base model's outputs (peft's disable_adapter)."""
        context: AbstractContextManager[None] = self.peft.disable_adapter()
        return context

    def counts(self) -> tuple[int, int]:
        """(trainable parameters, all parameters)."""
        trainable, total = self.peft.get_nb_trainable_parameters()
        return int(trainable), int(total)

    def name_base(self, base: str, sha256: str | None = None) -> None:
        """What saved adapters name as their base model (`base_model_name_or_path`) and, for
        a GGUF or local folder base, its SHA-256 (a name alone would follow replaced weights)."""
        self.peft.peft_config[ADAPTER].base_model_name_or_path = base
        self.base_sha256 = sha256

    @property
    def base(self) -> str:
        """The base model saved adapters name."""
        return str(self.peft.peft_config[ADAPTER].base_model_name_or_path)

    def check_base(self, folder: Path) -> None:
        """On resume: the adapters saved in `folder` were trained on this base, the GGUF file
        or folder as it is now (when both digests are known)."""
        if self.base_sha256 is not None:
            check_base_sha256(folder, self.base, self.base_sha256)

    def save(self, folder: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
        """`adapter_config.json` and `adapter_model.safetensors` in `folder` (peft's
        save_pretrained); `weights`: the whole model's state dict where the model's own
        parameters are partitioned (ZeRO-3)."""
        if weights is not None:  # named as in the HF model: peft names them from its wrapper
            prefix = next(name for name, m in self.peft.named_modules() if m is self.model)
            weights = {f"{prefix}.{key}": tensor for key, tensor in weights.items()}
        # the vocabulary is never resized here: no embedding layers to save, and no lookup of
        # the base's config (a built-in or GGUF name is not a folder peft can read)
        self.peft.save_pretrained(str(folder), state_dict=weights, save_embedding_layers=False)
        if self.base_sha256 is not None:
            record = {"base_model_name_or_path": self.base, "sha256": self.base_sha256}
            write_text_atomic(folder / GGUF_BASE, json.dumps(record, indent=1) + "\n")

    def load(self, folder: Path) -> None:
        """The adapter weights of `folder`, which must be exactly this model's adapters."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict
        from safetensors.torch import load_file

        self.check_base(folder)
        file = folder / ADAPTER_WEIGHTS
        try:
            weights = load_file(str(file))
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise GspoError(f"checkpoint {file} is missing or corrupted: {exc}") from None
        # no embedding check: it looks the base up by name (the hub, for a hub id)
        expected = set(get_peft_model_state_dict(self.peft, save_embedding_layers=False))
        if set(weights) != expected:
            extra = sorted(set(weights) ^ expected)[:3]
            raise GspoError(f"checkpoint {folder}: its adapters do not match the model's: {extra}")
        set_peft_model_state_dict(self.peft, weights)

    def merged_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's weights with the adapters merged in, by the plain HF names (`W + (alpha
        / r) B A`, from each layer's peft `get_delta_weight`), computed aside: the model
        itself is not touched (merging in place and back would round its base weights)."""
        deltas = {  # a LoRA layer adapts its base layer's weight, a ParamWrapper any parameter
            f"{_unwrapped(name)}.{getattr(module, 'parameter_name', 'weight')}": module
            for name, module in self.model.named_modules()
            if hasattr(module, "get_delta_weight") and ADAPTER in getattr(module, "lora_A", {})
        }
        with torch.no_grad():
            for key, tensor in self.model.state_dict().items():
                if LORA_KEY in key:
                    continue
                name = _unwrapped(key)
                if name in deltas:
                    delta = deltas[name].get_delta_weight(ADAPTER)
                    tensor = tensor + delta.to(tensor.dtype)
                yield name, tensor


def merge_adapters(model: PreTrainedModel, folder: Path) -> PreTrainedModel:
    """`model` (the base) with the adapters saved in `folder` merged into its weights: a plain
    HF model (peft's merge_and_unload)."""
    from peft import PeftModel

    try:
        with _quiet_tied_warnings():  # _untie_adapted_head handles what they warn about
            adapted = PeftModel.from_pretrained(model, str(folder))
    except Exception as exc:  # peft and safetensors raise many types for a bad folder
        raise GspoError(f"cannot load the adapters in {folder}: {_first_line(exc)}") from None
    _untie_adapted_head(model)
    merged: PreTrainedModel = adapted.merge_and_unload()
    return merged


@contextmanager
def _quiet_tied_warnings() -> Iterator[None]:
    """Without peft's warnings about adapters on a tied layer (20-odd lines of advice on
    untying, per load): gspo refuses such a target in a new run (lora_targets.py) and
    merges older adapters untied (_untie_adapted_head)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TIED_WARNINGS)
        yield


def _untie_adapted_head(model: PreTrainedModel) -> None:
    """Adapters on an output head tied to the input embeddings (saved before gspo refused them):
    the trained model applied them to the head only, so the head gets a weight of its own, and
    the config says so, before they are merged into it."""
    head, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    base = getattr(head, "base_layer", None)  # peft's layer around the head, if it is adapted
    if base is None or inputs is None or base.weight is not inputs.weight:
        return
    base.weight = nn.Parameter(base.weight.detach().clone(), requires_grad=False)
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = False


def is_adapter_folder(path: Path) -> bool:
    """A folder of peft adapters (and no HF weights of its own)."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / HF_CONFIG).is_file()


def adapter_base(folder: Path) -> str:
    """The base model of the adapters in `folder`: its adapter_config.json's
    base_model_name_or_path, or, when that folder is gone and `folder` is a run's checkpoint,
    the run folder's own folder of that name (the run folder was moved)."""
    file = folder / ADAPTER_CONFIG
    base = _json_text(file, "base_model_name_or_path", "names no base model")
    path = Path(base)
    if path.is_absolute() and not path.exists() and folder.parent.name == CHECKPOINTS:
        moved = folder.parent.parent / path.name
        if (moved / HF_CONFIG).is_file():
            return str(moved)
    return base


def recorded_base_sha256(folder: Path) -> str | None:
    """The SHA-256 of the GGUF or folder base the adapters in `folder` were saved on; None when
    none was recorded (a hub or run-folder base, or adapters saved before digests were)."""
    file = folder / GGUF_BASE
    if not file.is_file():
        return None
    return _json_text(file, "sha256", "records no SHA-256 of the base model")


def _json_text(file: Path, key: str, missing: str) -> str:
    """The non-empty text under `key` in the JSON object of `file`; one GspoError line when the
    file cannot be read or lacks it (`missing` says what that means)."""
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GspoError(f"cannot read {file}: {exc}") from None
    value = record.get(key) if isinstance(record, dict) else None
    if not isinstance(value, str) or not value:
        raise GspoError(f"{file} {missing} ({key})")
    return value


def check_base_sha256(folder: Path, base: str | Path, sha256: str) -> None:
    """Refuse to put the adapters in `folder` on the `base` (a GGUF file or a local folder)
    that now has `sha256` when they recorded another: replaced weights would silently change
    the model they adapt."""
    recorded = recorded_base_sha256(folder)
    if recorded is not None and recorded != sha256:
        raise GspoError(
            f"{base} has changed since the adapters in {folder} were trained on it: its SHA-256 "
            f"was {recorded[:12]}, it is {sha256[:12]} now; put the original weights back, or "
            "train new adapters"
        )


def _unwrapped(name: str) -> str:
    """A module or parameter name as in the plain HF model: without peft's `base_layer`s."""
    return BASE_LAYER.sub("", name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
