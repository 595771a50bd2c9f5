"""A guard's decision carried out in the running job (train/run/guard.py decides): a warning
line; a rollback to the last good checkpoint, with a lower learning rate and fresh sampling
seeds; or a stop that writes the summary and says where a resume starts and with what command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from gspo_cli.core.errors import GspoError
from gspo_cli.runs.folder import CHECKPOINTS
from gspo_cli.train.run.checkpoint import checkpoint_at_or_before, latest_checkpoint, roll_back_to
from gspo_cli.train.run.guard import Decision, Remedy, resume_advice, rollback_target
from gspo_cli.train.run.log import TrainResult, write_summary
from gspo_cli.train.run.prepare import PreparedRun
from gspo_cli.train.run.state import restore_checkpoint
from gspo_cli.train.step.collection import step_seed


def carry_out(
    run: PreparedRun, step: int, decision: Decision, result: TrainResult, display: Any
) -> int:
    """Record and carry out a guard decision; the step to continue from (rollback) or `step`."""
    root = run.run_dir / CHECKPOINTS
    good = checkpoint_at_or_before(root, rollback_target(step))  # before the trouble began
    action, reason = decision.action, decision.reason
    if action == "rollback" and good is None:
        action, reason = "stop", f"{reason}; no checkpoint to roll back to"
    for event in decision.events:
        run.log.event(
            {"step": step, "signal": event.signal, "action": action, "detail": event.detail}
        )
    if action == "warn":
        display.note(f"warning: step {step}: {reason} (trainer.on_collapse: warn)")
        return step
    if action == "rollback" and good is not None:
        restored = _restore(run, good, result)
        display.note(
            f"step {step}: {reason}; rolled back to {good.name}, learning rate "
            f"{run.engine.lr:.3g} (x{run.state.lr_scale:g}), fresh sampling seeds"
        )
        return restored
    if good is not None:  # so that --resume starts before the trouble, as the line says
        roll_back_to(root, good, run.ctx)
    if run.ctx.is_main:
        write_summary(run.run_dir, result, run.log.events())
    advice = _stop_advice(run, step, good, decision.remedy)
    raise GspoError(f"stopped at step {step}: {reason}. {advice}")


def _stop_advice(run: PreparedRun, step: int, good: Path | None, remedy: Remedy | None) -> str:
    """Where a resume starts, the cause the guard measured, and the command that resumes with
    its remedy: e.g. a lower learning rate (below the one that failed, rollbacks included)."""
    root = run.run_dir / CHECKPOINTS
    if good is not None:
        where = f"A resume starts from {good} (before the trouble)"
    elif (latest := latest_checkpoint(root, cleanup=False)) is not None:
        where = (
            f"A resume starts from {latest}, the newest checkpoint (none is from step "
            f"{rollback_target(step)} or before, where a slow collapse may begin)"
        )
    else:
        where = "There is no checkpoint yet: a resume starts from step 0"
    lr = run.recipe.optimizer.lr * run.state.lr_scale * run.recipe.trainer.rollback_lr_factor
    command = resume_advice(run.run_dir, lr, run.ctx.world, sys.argv[1:], remedy)
    why = "" if remedy is None else f"; {remedy.why}"
    return f"{where}{why}; resume with: {command}"


def _restore(run: PreparedRun, folder: Path, result: TrainResult) -> int:
    """Load checkpoint `folder` into the running job and forget the steps after it."""
    trainer_state = restore_checkpoint(
        folder,
        engine=run.engine,
        sampler=run.sampler,
        log=run.log,
        reference=run.ref_engine,
        ref_update_every=run.recipe.algorithm.ref_update_every,
        ctx=run.ctx,
    )
    restored = int(trainer_state["step"])
    state = run.state
    state.step = restored
    state.rollbacks += 1
    state.lr_scale *= run.recipe.trainer.rollback_lr_factor  # compounds over rollbacks
    run.engine.set_peak_lr(run.recipe.optimizer.lr * state.lr_scale)
    # Unseeded sampling draws from the global RNG just restored: without a new seed the
    # retried steps would replay the same rollouts.
    torch.manual_seed(step_seed(run.recipe.trainer.seed, restored, state.rollbacks))
    roll_back_to(run.run_dir / CHECKPOINTS, folder, run.ctx)
    if run.rollouts is not None:  # drop the batches sampled on the abandoned trajectory
        run.rollouts.start(restored, state.rollbacks, run.sampler.state_dict())
    for later in [s for s in result.heldout if s > restored]:
        del result.heldout[later]
    result.steps_done = restored
    return restored
