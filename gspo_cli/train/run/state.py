"""A run's state beyond its weights, in one home: written into every checkpoint, and restored
from one in one way (`restore_checkpoint`) by `--resume` and by a guard's rollback alike."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import LATEST
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TrainEngine
from gspo_cli.train.run.checkpoint import checkpoint_at_or_before, load_trainer_state, set_rng_state
from gspo_cli.train.run.log import RunLog
from gspo_cli.train.run.reference import restore_reference
from gspo_cli.train.step.sampler import MixtureSampler


@dataclass
class RunState:
    """Where a run is: its last step done and the rollbacks it has been through."""

    step: int = 0
    rollbacks: int = 0  # they enter the sampling seeds
    lr_scale: float = 1.0  # the rollbacks' factors on recipe.optimizer.lr, multiplied

    def trainer_state(
        self, sampler: MixtureSampler, world: int, recipe_lr: float
    ) -> dict[str, Any]:
        """What a checkpoint's trainer state holds of it (the RNGs and the step are added by
        checkpoint.save_checkpoint)."""
        return {
            "sampler": sampler.state_dict(),
            "world": world,
            "rollbacks": self.rollbacks,
            "lr_scale": self.lr_scale,
            "recipe_lr": recipe_lr,  # a resume that changes it drops lr_scale
        }

    @classmethod
    def from_trainer_state(cls, state: dict[str, Any], recipe_lr: float) -> RunState:
        """The state a checkpoint saved. The rollbacks' factor on the learning rate is kept,
        unless optimizer.lr changed since (the new value is then the peak, as recipe.yaml says)."""
        changed = float(state.get("recipe_lr", recipe_lr)) != recipe_lr
        scale = 1.0 if changed else float(state.get("lr_scale", 1.0))
        return cls(int(state["step"]), int(state.get("rollbacks", 0)), scale)


def restore_checkpoint(
    folder: Path,
    *,
    engine: TrainEngine,
    sampler: MixtureSampler,
    log: RunLog,
    reference: FrozenPolicy | None,
    ref_update_every: int,
    ctx: DistContext,
) -> dict[str, Any]:
    """Bring a run back to checkpoint `folder`: weights and optimiser, the sampler's position,
    the RNGs, the KL reference, and the logs cut after its step. Returns its trainer state."""
    state = load_trainer_state(folder)
    saved_world = int(state.get("world", 1))
    if saved_world != ctx.world and not engine.allows_resharding:
        raise GspoError(
            f"checkpoint {folder} was written by {saved_world} process(es); this engine cannot "
            f"re-partition its optimizer state for {ctx.world}: resume with --nproc {saved_world} "
            f"(with a --hostfile: {saved_world} processes over all its hosts)"
        )
    engine.load_state(folder)
    if not engine.weights_finite():  # written before the guard existed, or by another tool
        _non_finite(folder, int(state["step"]))
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    step = int(state["step"])
    restore_reference(reference, ref_update_every, folder, step, engine)
    log.truncate_after(step)
    return state


def _non_finite(folder: Path, step: int) -> None:
    root = folder.parent
    older = checkpoint_at_or_before(root, step - 1)
    hint = (
        f"the last good one is {older}; to resume from it: printf {older.name} > "
        f"{shlex.quote(str(root / LATEST))}, then rerun with --resume"
        if older
        else "none is older: start over"
    )
    raise GspoError(f"checkpoint {folder} holds non-finite weights; {hint}")
