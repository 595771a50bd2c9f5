"""Which modules LoRA adapters may target, checked before any weights load: the targets a
model lacks or ties to another module (a merged adapter would change both), on the model itself
or on its skeleton on the meta device, and the adapters' size per unit of rank, from peft.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

ALL_LINEAR = "all-linear"  # peft: every linear layer but the output head
ADAPTER = "default"  # peft's name of a model's one adapter


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers, in order: what target_modules
    usually name (q_proj, v_proj, ...)."""
    from transformers.pytorch_utils import Conv1D

    names: dict[str, None] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, Conv1D)) and name:
            names[name.rpartition(".")[2]] = None
    return list(names)


def target_problem(model: nn.Module, targets: list[str] | str, label: str) -> str | None:
    """One line naming the first of `targets` that `model` (called `label`) lacks, and the
    linear modules it has; None when it has them all. A name matches a module whose dotted
    name is it or ends with `.name`, as in peft."""
    if isinstance(targets, str):
        return None  # all-linear: whatever the model has
    modules = [name for name, _ in model.named_modules()]
    for target in targets:
        if not any(_matches(name, target) for name in modules):
            return (
                f"model.lora.target_modules: {label} has no module {target!r}; its linear "
                f"modules are {', '.join(linear_names(model))} (or use {ALL_LINEAR})"
            )
    return tied_target_problem(model, targets, label)


def tied_target_problem(model: nn.Module, targets: list[str], label: str) -> str | None:
    """One line naming a target whose weight `model` shares with another module (an LM head
    tied to the input embeddings): merged, its adapter would change that module too, so the
    exported model would compute something else than the trained one."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    for name, module in model.named_modules():
        if not any(_matches(name, target) for target in targets):
            continue
        for key, param in module.named_parameters(recurse=False):
            others = [other for other in owners[id(param)] if other != f"{name}.{key}"]
            if others:
                shared = others[0].rpartition(".")[0]
                return (
                    f"model.lora.target_modules: {name} of {label} shares its {key} with "
                    f"{shared} (tied embeddings): a LoRA on it would also change {shared} once "
                    f"merged, so export and eval would differ from the trained model; remove "
                    f"{name.rpartition('.')[2]} from target_modules ({ALL_LINEAR} leaves the "
                    "output head out)"
                )
    return None


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith(f".{target}")


def model_skeleton(path: str, config_dir: Path | None) -> nn.Module | None:
    """`path`'s modules without weights (on the meta device): a built-in model, or the model
    of the config.json in `config_dir`; None when neither applies."""
    from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX, BUILTIN_MODELS
    from gspo_cli.models.tokenizer import build_char_tokenizer

    with torch.device("meta"):
        if path.startswith(BUILTIN_MODEL_PREFIX):
            name = path.removeprefix(BUILTIN_MODEL_PREFIX)
            if name not in BUILTIN_MODELS:
                return None
            return BUILTIN_MODELS.get(name)(build_char_tokenizer())
        if config_dir is None:
            return None
        from transformers import AutoConfig, AutoModelForCausalLM

        try:
            config = AutoConfig.from_pretrained(str(config_dir), local_files_only=True)
            return AutoModelForCausalLM.from_config(config)
        except (OSError, ValueError, KeyError):  # loading the model reports it
            return None


def adapter_size(model: nn.Module, targets: list[str] | str) -> tuple[int, int] | None:
    """(adapter parameters per unit of rank, the largest min(in, out) of an adapted layer) of
    LoRA on `targets`, from peft itself on `model` (a skeleton on the meta device, which this
    wraps): adapters grow linearly with the rank, so rank 1 tells them. None when peft
    refuses the targets (Adapters.add reports it)."""
    import peft
    from peft.tuners.lora import LoraLayer

    config = peft.LoraConfig(r=1, target_modules=targets, task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a sizing pass: Adapters.add warns what matters
            wrapped = peft.get_peft_model(model, config)
    except ValueError:
        return None
    dims = [
        min(module.in_features, module.out_features)
        for module in wrapped.modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    ]
    per_rank, _ = wrapped.get_nb_trainable_parameters()
    return int(per_rank), max(dims, default=0)
