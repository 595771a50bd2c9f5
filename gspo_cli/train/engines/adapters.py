"""LoRA in a training run (`model.lora`; the peft side is models/lora.py): each engine adds the
adapters to the model it wraps and trains only them, the KL reference is that same model with
them switched off (reference.BaseReference), and checkpoints hold the adapters and name the
base model (a GGUF base or a local folder with its SHA-256, which loading the adapters checks).

The base model is the policy RL starts from: the cold-start result when the cold start is on
(saved in the run folder anyway), else the recipe's model. A hub id or a local folder is named
as it is (not copied). A built-in model is created from a seed, so a LoRA run on one saves it
once in the run folder (`lora_base/`, an HF checkpoint of a few MB): evaluation and export load the
exact weights that were trained on, whatever another torch version would initialise.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import SAFE_WEIGHTS_NAME as WEIGHTS_NAME

from gspo_cli.models.builtin import BUILTIN_MODEL_PREFIX
from gspo_cli.models.gguf import GGUF_SUFFIX
from gspo_cli.models.loading import base_digest, hf_path, is_gguf_path
from gspo_cli.models.lora import Adapters
from gspo_cli.models.lora_targets import adapter_size, model_skeleton, target_problem
from gspo_cli.recipe.bounds import check_lora_memory, model_config_file, warn_memory
from gspo_cli.recipe.inputs import LoraConfig
from gspo_cli.recipe.schema import Recipe
from gspo_cli.runs.folder import COLD_START, LORA_BASE, save_hf_folder
from gspo_cli.train.engines.distributed import DistContext


def add_adapters(model: PreTrainedModel, cfg: LoraConfig) -> Adapters | None:
    """`model` frozen with fresh adapters of `cfg`, or None when LoRA is off (r 0)."""
    if cfg.r == 0:
        return None
    return Adapters.add(
        model, r=cfg.r, alpha=cfg.alpha, dropout=cfg.dropout, targets=cfg.target_modules
    )


def early_lora_problem(recipe: Recipe) -> str | None:
    """A `model.lora` problem found before anything is loaded or written, when the model's
    modules are known without the hub or its weights (built on the meta device from a
    built-in's or a config.json's description; not with remote code, which would run here):
    a target module the model lacks or that shares its weight (a tied LM head), a rank larger
    than any adapted layer can use, or one whose adapters exceed the machine's memory. The
    engine checks the loaded model's targets again."""
    lora = recipe.model.lora
    skeleton = None if recipe.model.trust_remote_code else _skeleton(recipe.model.path)
    size = None
    if skeleton is not None:
        problem = target_problem(skeleton, lora.target_modules, recipe.model.path)
        if problem is not None:
            return problem
        size = adapter_size(skeleton, lora.target_modules)
    if size is None:
        warn_memory(recipe, 0)  # the adapters' size unknown: the rest of the estimate
        return None
    per_rank, widest = size
    return rank_problem(lora.r, per_rank, widest) or check_lora_memory(recipe, lora.r * per_rank)


def _skeleton(path: str) -> nn.Module | None:
    """The model of `path` on the meta device; None when it is not known without the hub."""
    if is_gguf_path(path):  # its converted folder (converted now if need be: training would)
        path = hf_path(path, what="model.path")
    file = None if path.startswith(BUILTIN_MODEL_PREFIX) else model_config_file(path)
    return model_skeleton(path, file.parent if file is not None else None)


def rank_problem(r: int, per_rank: int, widest: int) -> str | None:
    """The line refusing a rank above every adapted layer's min(in, out): a rank-k update of a
    layer has at most rank min(in, out), so the rest adds parameters and no expressiveness."""
    if not widest or r <= widest:
        return None
    return (
        f"model.lora.r: {r} is more than any adapted layer can use: an update of a layer has "
        f"at most rank min(in, out), {widest} at most here, so r {r} only adds parameters "
        f"({r * per_rank:,} instead of {widest * per_rank:,}); use r {widest} or less"
    )


def base_name(recipe: Recipe, run_dir: Path) -> str:
    """What a LoRA run's checkpoints name as their base model (`base_model_name_or_path`)."""
    if recipe.cold_start.enabled:
        return str((run_dir / COLD_START).resolve())
    if is_gguf_path(
        recipe.model.path
    ):  # rebuilt exactly from its file (models/gguf.py), not copied
        path = recipe.model.path
        return str(Path(path).expanduser().resolve()) if path.endswith(GGUF_SUFFIX) else path
    if recipe.model.path.startswith(BUILTIN_MODEL_PREFIX):
        return str((run_dir / LORA_BASE).resolve())
    local = Path(recipe.model.path).expanduser()
    return str(local.resolve()) if local.is_dir() else recipe.model.path


def base_sha256(recipe: Recipe) -> str | None:
    """The SHA-256 of the base a LoRA run's adapters are saved on (`base_name` names it): a
    GGUF file, or a local folder's weights (models.loading.base_digest), saved with the adapters
    so that a base changed since is refused; None for a base in the run folder or on the hub."""
    return None if recipe.cold_start.enabled else base_digest(recipe.model.path)


def save_builtin_base(
    recipe: Recipe,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    run_dir: Path,
    ctx: DistContext,
) -> None:
    """A LoRA run on a built-in model without cold start: save the base (rank 0), before the
    adapters go in. A base saved by an earlier start is kept when it holds these weights (a
    resume), else replaced (a rerun with another seed after a failed start)."""
    path = recipe.model.path
    builtin = path.startswith(BUILTIN_MODEL_PREFIX) and not is_gguf_path(path)
    if not recipe.model.lora.r or recipe.cold_start.enabled or not builtin:
        return
    folder = run_dir / LORA_BASE
    if ctx.is_main and not _holds(folder, model):
        shutil.rmtree(folder, ignore_errors=True)
        save_hf_folder(model, tokenizer, run_dir, LORA_BASE, "the LoRA base model")
    ctx.barrier()


def _holds(folder: Path, model: PreTrainedModel) -> bool:
    """Whether the HF checkpoint `folder` holds exactly `model`'s weights."""
    from safetensors.torch import load_file

    try:
        saved = load_file(str(folder / WEIGHTS_NAME))
    except Exception:  # missing or damaged: save it again
        return False
    state = model.state_dict()
    return all(k in state and torch.equal(v, state[k].cpu()) for k, v in saved.items())


def trainable_line(adapters: Adapters, cfg: LoraConfig) -> str:
    """The line a LoRA run prints at its start: what trains, of how much."""
    trainable, total = adapters.counts()
    targets = cfg.target_modules
    where = targets if isinstance(targets, str) else ", ".join(targets)
    return (
        f"lora: r {cfg.r}, alpha {cfg.alpha:g} on {where}: {trainable:,} of {total:,} "
        f"parameters train ({trainable / total:.2%})"
    )
