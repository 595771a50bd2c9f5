"""`--resume`: which recipe changes a resumed run accepts, and restoring its checkpoint.

A resume continues a run from the checkpoint `checkpoints/latest` names. Settings that cannot
break the run may change (RESUMABLE_CHANGES: the learning rate and its schedule, checkpoint
cadence and retention, logging, the evaluation cadence, the length, the guards); each change is
printed, `recipe.yaml` becomes the new resolved recipe, and the restored optimizer takes the new
learning rate (a restored scheduler would otherwise bring back the old one). Any other change is
refused with its keys named, since the checkpoint was made with the old values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from gspo_cli.core.errors import GspoError
from gspo_cli.models.loading import check_base_digest
from gspo_cli.recipe.schema import Recipe
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    COLD_START,
    HF_CONFIG,
    LATEST,
    RECIPE,
    saved_recipe_section,
)
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TrainEngine
from gspo_cli.train.run.checkpoint import latest_checkpoint
from gspo_cli.train.run.log import RunLog
from gspo_cli.train.run.state import RunState, restore_checkpoint
from gspo_cli.train.step.sampler import MixtureSampler

# What may change on resume (whole sections end in "."): nothing the checkpoint was made with.
RESUMABLE_CHANGES = (
    "optimizer.lr", "optimizer.schedule", "optimizer.warmup_steps", "optimizer.min_lr_ratio",
    "optimizer.max_grad_norm", "trainer.steps", "trainer.checkpoint_every",
    "trainer.keep_checkpoints", "trainer.keep_best", "trainer.best_metric", "trainer.best_mode",
    "trainer.keep_every", "trainer.log_samples", "trainer.stop_grace_s",
    "trainer.max_bad_updates", "trainer.on_collapse", "trainer.rollback_lr_factor",
    "trainer.max_rollbacks", "eval.every", "logging.", "rollout.max_staleness",
    "rollout.worker_threads", "rollout.worker_timeout_s",
    # the guard's advice may change these (train/run/guard.py Remedy); no checkpoint state
    # depends on them (a reference the checkpoint lacks is refused by restore_reference)
    "algorithm.entropy_coef", "algorithm.kl_coef",
)  # fmt: skip

# What the cold start was made from: a run that keeps its cold start must not change these.
COLD_START_INPUTS = (
    "model.", "data.", "cold_start.", "trainer.seed", "eval.num_problems", "eval.benchmark",
)  # fmt: skip


def recipe_changes(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Every leaf key whose value differs between two recipe trees: key -> (old, new)."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: dict[str, tuple[Any, Any]] = {}
        for key in set(old) | set(new):
            found.update(recipe_changes(old.get(key), new.get(key), f"{prefix}{key}."))
        return found
    return {} if old == new else {prefix.rstrip("."): (old, new)}


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns)


def with_defaults(tree: Any, defaults: Any) -> Any:
    """A recipe tree with every key it lacks taken from `defaults`: a key the schema gained
    after a run was made held its default's behaviour in that run, so it is no change."""
    if not (isinstance(tree, dict) and isinstance(defaults, dict)):
        return tree
    missing = {key: value for key, value in defaults.items() if key not in tree}
    return {**missing, **{key: with_defaults(v, defaults.get(key)) for key, v in tree.items()}}


def saved_changes(run_dir: Path, recipe_yaml: str) -> dict[str, tuple[Any, Any]]:
    """Every setting `recipe_yaml` changes from the run folder's saved recipe (defaults filled
    in on both sides): key -> (old, new)."""
    saved = run_dir / RECIPE
    if not saved.is_file():
        return {}
    defaults = Recipe().model_dump(mode="json")  # both sides: either may be a partial recipe
    old = with_defaults(yaml.safe_load(saved.read_text(encoding="utf-8")), defaults)
    return recipe_changes(old, with_defaults(yaml.safe_load(recipe_yaml), defaults))


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def resume_changes(run_dir: Path, recipe_yaml: str) -> list[str]:
    """`resume: KEY OLD -> NEW` for each setting that differs from the run folder's recipe."""
    changed = saved_changes(run_dir, recipe_yaml)
    return [f"resume: {k} {_show(a)} -> {_show(b)}" for k, (a, b) in sorted(changed.items())]


def check_resumable(run_dir: Path, recipe_yaml: str) -> None:
    """What --resume reuses must come from the same recipe: all but RESUMABLE_CHANGES with a
    checkpoint, the cold start's inputs with only a cold start, nothing otherwise."""
    changed = saved_changes(run_dir, recipe_yaml)
    saved = run_dir / RECIPE
    if (run_dir / CHECKPOINTS / LATEST).is_file():
        refused = sorted(k for k in changed if not _matches(k, RESUMABLE_CHANGES))
        if refused:
            raise GspoError(
                f"--resume: {', '.join(refused)} differ from {saved}, and the checkpoint was "
                "made with them (a resume may change the learning rate and its schedule, "
                "checkpointing, logging, eval.every, trainer.steps, the guard settings, "
                "algorithm.entropy_coef and algorithm.kl_coef)"
            )
    elif (run_dir / COLD_START / HF_CONFIG).is_file():
        stale = sorted(k for k in changed if _matches(k, COLD_START_INPUTS))
        if stale:
            raise GspoError(
                f"--resume: {', '.join(stale)} differ from {saved}, and the cold start in "
                f"{run_dir / COLD_START} was made with them: remove that folder to redo it"
            )


def resume_from_checkpoint(
    run_dir: Path,
    recipe: Recipe,
    engine: TrainEngine,
    sampler: MixtureSampler,
    log: RunLog,
    reference: FrozenPolicy | None,
    ctx: DistContext,
    console: Console,
) -> RunState:
    """Restore the latest checkpoint (run_state.restore_checkpoint); where it is."""
    root = run_dir / CHECKPOINTS
    if ctx.is_main:
        latest_checkpoint(root)  # removes what a kill during a save left behind
    ctx.barrier()
    folder = latest_checkpoint(root, cleanup=False)
    if folder is None:  # killed before the first checkpoint: start over, keep the cold start
        kept = " (the cold start is kept)" if (run_dir / COLD_START / HF_CONFIG).is_file() else ""
        console.print(
            f"no checkpoint in {root}: starting from step 0{kept}", highlight=False, soft_wrap=True
        )
        log.truncate_after(-1)
        return RunState()
    every = recipe.algorithm.ref_update_every
    state = restore_checkpoint(
        folder,
        engine=engine,
        sampler=sampler,
        log=log,
        reference=reference,
        ref_update_every=every,
        ctx=ctx,
    )
    resumed = RunState.from_trainer_state(state, recipe.optimizer.lr)
    engine.set_peak_lr(recipe.optimizer.lr * resumed.lr_scale)
    console.print(
        f"resume: loaded checkpoint {folder} (step {resumed.step})", highlight=False, soft_wrap=True
    )
    if resumed.lr_scale != 1.0:
        console.print(
            f"resume: the learning rate stays x{resumed.lr_scale:g} from "
            f"{resumed.rollbacks} rollback(s) (a new optimizer.lr replaces it)",
            highlight=False,
        )
    return resumed


def check_resumed_base(recipe: Recipe, run_dir: Path) -> None:
    """On --resume of a LoRA run on a GGUF base or a local folder: it must still be the model
    the latest checkpoint's adapters were trained on, checked before a GGUF is converted
    (about 20 s for SmolLM2; the LoRA target check converts it) or the run folder is reopened.
    Loading the checkpoint checks it again."""
    if not recipe.model.lora.r or _saved_model_path(run_dir) != recipe.model.path:
        return  # another base, or no readable recipe: check_resumable says so in its own words
    latest = latest_checkpoint(run_dir / CHECKPOINTS, cleanup=False)
    if latest is not None:  # a checkpoint without the record (e.g. cold start on) is not checked
        check_base_digest(latest, recipe.model.path)


def _saved_model_path(run_dir: Path) -> Any:
    """The run's model.path as its recipe.yaml saved it; None when that cannot be read."""
    return saved_recipe_section(run_dir, "model").get("path")
