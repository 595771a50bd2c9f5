"""The KL reference: the initial policy, or one refreshed every N steps (`ref_update_every`).

With N > 0 the reference of step s is the policy as it was after step floor((s - 1) / N) * N:
after every step that is a multiple of N, the current weights are copied into it (`refresh`).

Resume and rollback must see the same reference as an uninterrupted run. A checkpoint of step c
with c a multiple of N needs nothing extra: the reference is its own weights. Any other
checkpoint stores the reference's weights in its trainer state (`reference_state`), so a
`checkpoint_every` that is a multiple of `ref_update_every` stores no second copy. With N = 0
the reference never changes and nothing is stored: it is built from the starting weights before
a resume loads the checkpoint's.

Under DeepSpeed the weights come from `engine.full_weights()`, whole on every rank (collective
under ZeRO-3: every rank calls these functions at the same point).

With LoRA (`model.lora.r` > 0) the reference is the base model: the trained model itself with its
adapters switched off by peft (`BaseReference`), no second copy. It never changes (the recipe
refuses `ref_update_every` with LoRA), so checkpoints store nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.logprobs import EntropyMode
from gspo_cli.models.lora import Adapters
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TrainEngine
from gspo_cli.train.run.checkpoint import load_trainer_state

REFERENCE_KEY = "reference"  # the trainer-state entry holding the reference's weights


class BaseReference(FrozenPolicy):
    """The KL reference of a LoRA run: the engine's own model scored with its adapters off."""

    def __init__(self, engine: TrainEngine, adapters: Adapters) -> None:
        self.engine = engine
        self.adapters = adapters
        self.model = adapters.model
        self.capabilities = engine.capabilities

    def logprobs(
        self, batch: TrainBatch, temperature: float, entropy: EntropyMode = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.adapters.disabled():
            return self.engine.logprobs(batch, temperature, entropy)


def copy_weights(reference: FrozenPolicy, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy named tensors into the reference's parameters and buffers; every parameter must
    be among them (a naming mismatch must not leave part of the reference stale)."""
    target = reference.model.state_dict()  # name -> tensor sharing the parameter's storage
    copied = set()
    with torch.no_grad():
        for name, tensor in weights:
            if name in target:
                target[name].copy_(tensor.to(target[name].device))
                copied.add(name)
    missing = [name for name, _ in reference.model.named_parameters() if name not in copied]
    if missing:
        raise GspoError(f"KL reference refresh: no weights for {', '.join(missing[:3])}")


def refresh(reference: FrozenPolicy | None, every: int, step: int, engine: TrainEngine) -> bool:
    """After step `step`: copy the policy into the reference when `every` divides the step.
    Returns whether it did."""
    if reference is None or every == 0 or step % every != 0:
        return False
    copy_weights(reference, engine.full_weights())
    return True


def reference_state(reference: FrozenPolicy | None, every: int, step: int) -> dict[str, Any]:
    """What checkpoint `step`'s trainer state needs to bring the reference back: its weights
    where they are not the checkpoint's own (see the module's docstring), else nothing."""
    if reference is None or every == 0 or step % every == 0:
        return {}
    state = reference.model.state_dict()
    return {REFERENCE_KEY: {name: t.detach().cpu().clone() for name, t in state.items()}}


def restore_reference(
    reference: FrozenPolicy | None, every: int, folder: Path, step: int, engine: TrainEngine
) -> None:
    """The reference of a run restored from checkpoint `folder` (step `step`), once `engine`
    holds that checkpoint's weights: on resume and on rollback."""
    if reference is None or every == 0:
        return  # the starting policy, never changed
    if step % every == 0:
        copy_weights(reference, engine.full_weights())
        return
    saved = load_trainer_state(folder).get(REFERENCE_KEY)
    if saved is None:
        raise GspoError(
            f"checkpoint {folder} holds no KL reference weights (algorithm.ref_update_every "
            f"{every}): resume from a checkpoint of a step that is a multiple of {every}"
        )
    copy_weights(reference, saved.items())
