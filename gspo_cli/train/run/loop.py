"""`gspo train`: cold start (optional), then GSPO/GRPO steps, with evals and checkpoints.

Where this departs from the paper: the built-in task is tiny integer arithmetic, the models are
tiny, and held-out accuracy is avg@k at the rollout temperature on that task. With several
processes (DeepSpeed), each rank samples whole groups for its share of the prompts, with one
seed per prompt, so the run does not depend on the world size.

`train` = `prepare_run` (train/run/prepare.py: everything built once) + `run_loop` (the steps);
the guard's decisions are carried out by train/run/guard_actions.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from gspo_cli.models.loading import convert_first
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import RolloutEngine
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.runs.collapse import CollapseDetector, HeldoutSize
from gspo_cli.runs.folder import (
    CHECKPOINTS,
    COLD_START,
    step_folder,
)
from gspo_cli.sandbox.isolation import allow_weak_isolation
from gspo_cli.train.async_rollouts.trainer import AsyncRollouts, saved_in_flight
from gspo_cli.train.engines.device import peak_memory_mb, resolve_device
from gspo_cli.train.engines.torch_engine import UpdateFailed
from gspo_cli.train.run.cold_start import load_recipe_model, run_cold_start
from gspo_cli.train.run.console import TrainingDisplay, heldout_change
from gspo_cli.train.run.environments import RunEnvironment, load_environments, mixed_heldout
from gspo_cli.train.run.folder import prepare_run_dir
from gspo_cli.train.run.guard import Guard
from gspo_cli.train.run.guard_actions import carry_out
from gspo_cli.train.run.heldout import heldout_accuracy
from gspo_cli.train.run.heldout_judge import judge_heldout
from gspo_cli.train.run.log import RunLog, TrainResult, write_summary
from gspo_cli.train.run.prepare import PreparedRun, prepare_run
from gspo_cli.train.run.problem_sets import (
    Problems,
    eval_format,
    eval_params,
    tool_prompts,
)
from gspo_cli.train.run.reference import refresh
from gspo_cli.train.run.signals import stop_on_signals
from gspo_cli.train.step.collection import PromptSource, collect_step, short_notice, step_seed
from gspo_cli.train.step.update import RankShare, StepModels, train_groups


def train(
    recipe: Recipe,
    recipe_yaml: str,
    *,
    run_dir: Path,
    resume: bool = False,
    console: Console | None = None,
) -> TrainResult:
    # SIGTERM asks for a stop at the next step boundary (train/run/signals.py), from here on.
    with stop_on_signals(recipe.trainer.stop_grace_s) as stop:
        run = prepare_run(recipe, recipe_yaml, run_dir, resume, console, stop)
        try:
            return run_loop(run)
        finally:
            run.close()


def _evaluate(run: PreparedRun, step: int) -> float:
    """Held-out accuracy of every environment (each its own problems, samples and format);
    with several, their weighted mean (train/run/environments.py) and each under env/NAME/."""
    # Every rank evaluates the same problems with the same seed (ZeRO-3 needs them all in
    # each forward); rank 0 records the result.
    started = time.perf_counter()
    values = {
        env.name: _evaluate_environment(run, env, run.step_environments[e].rollout, step)
        for e, env in enumerate(run.environments.environments)
    }
    mixed = run.environments.several
    result = (
        mixed_heldout(run.environments.environments, values)
        if mixed
        else next(iter(values.values()))
    )
    run.log.evaluation(step, result)
    if step > 0:  # step 0 is reported as "before RL"
        run.console.print(
            f"held-out accuracy at step {step}: {result['accuracy']:.1%} "
            f"({time.perf_counter() - started:.0f}s)",
            highlight=False,
        )
    return result["accuracy"]


def _evaluate_environment(
    run: PreparedRun, env: RunEnvironment, engine: RolloutEngine, step: int
) -> dict[str, float]:
    params = eval_params(env.recipe)
    where = f" of {env.name}" if run.environments.several else ""
    run.console.print(
        f"held-out evaluation{where} at step {step}: {len(env.heldout)} problems x "
        f"{params.num_samples} samples ...",
        highlight=False,
    )
    return heldout_accuracy(
        engine,
        run.tokenizer,
        env.heldout,
        params,
        run.recipe.trainer.seed + 7,
        run.math_pool,
        eval_format(env.recipe),
        tool_prompts(env.recipe),
    )


def run_loop(run: PreparedRun) -> TrainResult:
    """RL steps `run.start + 1 .. trainer.steps`, with held-out evals, checkpoints and guards."""
    recipe, ctx = run.recipe, run.ctx
    result = TrainResult(run.run_dir, run.start, run.log.evaluations())
    if run.start == 0:
        result.heldout[0] = _evaluate(run, 0)
        run.console.print(f"held-out accuracy before RL: {result.heldout[0]:.1%}", highlight=False)
    trainer, guard = recipe.trainer, _guard(run, result)
    steps, step = trainer.steps, run.start
    if recipe.rollout.max_staleness and step < steps:
        _start_rollouts(run)
    if trainer.on_collapse == "rollback" and step == 0:  # something to roll back to from step 1
        run.save_checkpoint(0)
    loop_started = time.perf_counter()
    with TrainingDisplay(run.console, steps, run.start, recipe.logging.console) as display:
        while step < steps:
            step += 1
            try:
                output, metrics = _one_step(run, step)
                # wall time of this process's steps so far, evals and checkpoints included
                metrics["time_elapsed_s"] = time.perf_counter() - loop_started
            except UpdateFailed as exc:  # applied and not undone (DeepSpeed): roll back or stop
                step = carry_out(run, step, guard.failed_update(step, str(exc)), result, display)
                guard.restarted()
                continue
            if step % recipe.eval.every == 0 or step == steps:
                result.heldout[step] = metrics["heldout_accuracy"] = _evaluate(run, step)
            metrics.update(judge_heldout(run, step))  # reward.heldout_judge, every N steps
            for line in guard.notices(step, metrics):
                display.note(line)
            short = short_notice(step, metrics, recipe.rollout.dynamic_sampling_max_rounds)
            if short is not None:  # trained on fewer groups than a full batch: say so
                display.note(short)
            decision = guard.after_step(step, metrics, recipe.algorithm.minibatches)
            run.log.metrics(step, metrics)
            g = recipe.rollout.group_size
            mine = ctx.rank * (recipe.rollout.num_prompts // ctx.world)
            _log_samples(
                run.log, step, output, trainer.log_samples, g, output.index[mine:], run.train_set
            )
            display.step(step, metrics)
            if decision.action != "go":
                step = carry_out(run, step, decision, result, display)
                if decision.action == "rollback":
                    guard.restarted()
                    continue
            if step % trainer.checkpoint_every == 0 or step == steps:
                run.save_checkpoint(step)
            result.steps_done = run.state.step = step
            run.stop_at_boundary(step)  # SIGTERM: checkpoint this step (unless just saved), stop
    if ctx.is_main:
        _finish(run.console, run.run_dir, result, run.log.events())
    return result


def _guard(run: PreparedRun, result: TrainResult) -> Guard:
    """The run's guard, having seen the held-out accuracy before RL where there is one."""
    recipe, trainer = run.recipe, run.recipe.trainer
    guard = Guard(
        trainer.max_bad_updates,
        trainer.on_collapse,
        trainer.max_rollbacks,
        rollbacks=run.state.rollbacks,
        entropy_coef=recipe.algorithm.entropy_coef,
        kl_coef=recipe.algorithm.kl_coef,
        detector=CollapseDetector(
            heldout_size=HeldoutSize(len(run.eval_problems), eval_params(recipe).num_samples)
        ),
    )
    if 0 in result.heldout:
        guard.detector.observe_heldout(0, result.heldout[0])
    return guard


def _one_step(run: PreparedRun, step: int) -> tuple[Any, dict[str, float]]:
    """One RL step on this rank's share of the prompts: collection (with dynamic sampling's
    rounds, train/step/collection.py), then training. After a rollback the sampling seeds are
    fresh (`run.state.rollbacks` enters them), so the retried steps draw other samples."""
    recipe, ctx = run.recipe, run.ctx
    started = time.perf_counter()
    seed = step_seed(recipe.trainer.seed, step, run.state.rollbacks)
    if run.rollouts is None:
        collected = collect_step(
            PromptSource(
                run.train_set.prompts, run.train_set.rows, run.sampler, run.step_environments
            ),
            run.settings,
            seed,
            ctx,
            note=lambda line: run.console.print(f"step {step}: {line}", highlight=False),
            step=step,
        )
    else:  # sampled by the worker while earlier steps trained
        batch, waited = run.rollouts.take(step)
        collected = batch.collected
        run.sampler.load_state_dict(batch.sampler_after)  # what a checkpoint of this step saves
    output = train_groups(
        StepModels(run.engine, run.ref_engine, run.teacher),
        collected.scored,
        run.settings,
        seed,
        RankShare(ctx, collected.group_offset),
    )
    output.index = collected.index
    refresh(run.ref_engine, recipe.algorithm.ref_update_every, step, run.engine)  # KL reference
    metrics = {**output.metrics, **collected.metrics}
    if "dynamic_sampling_rounds" in collected.metrics:  # reward_mean: every generated response's
        metrics["dynamic_sampling_batch_reward_mean"] = output.metrics["reward_mean"]
    if run.rollouts is not None:
        run.rollouts.publish(step)  # the weights after this step, for step + 1 + N's batch
        elapsed = time.perf_counter() - started  # the worker's time overlaps: wall time here
        metrics.update(
            rollout_staleness=float(step - 1 - batch.version),  # versions behind the trainer
            rollout_policy_version=float(batch.version),
            time_rollout_wait_s=waited,
            time_step_s=elapsed,
            tokens_per_s=metrics["completion_tokens"] / max(elapsed, 1e-9),
        )
    return output, {**metrics, "peak_memory_mb": peak_memory_mb(run.device)}


def _start_rollouts(run: PreparedRun) -> None:
    """The rollout worker of this rank; after a resume it first hands back the batches the
    checkpoint saved (train/async_rollouts/trainer.py)."""
    run.rollouts = AsyncRollouts(
        run.recipe, run.engine, run.tokenizer, (run.train_set.prompts, run.train_set.rows),
        (run.environments.plans(), run.sampler), run.settings, run.ctx, run.device,
        lambda line: run.console.print(line, highlight=False),
    )  # fmt: skip
    saved = []
    if run.start:
        folder = run.run_dir / CHECKPOINTS / step_folder(run.start)
        saved = saved_in_flight(
            folder, run.ctx.rank, run.recipe.rollout.max_staleness, run.state.rollbacks,
            run.ctx.world,
        )  # fmt: skip
    run.rollouts.start(run.start, run.state.rollbacks, run.sampler.state_dict(), saved)


def _log_samples(
    log: RunLog, step: int, output: Any, count: int, g: int, index: list[int], problems: Problems
) -> None:
    records = []
    traces = output.rollout.tool_traces  # tool use: how many calls each response made
    for i in range(min(count, len(output.rollout.texts))):
        row = problems.rows[index[i // g]]
        record = {
            "step": step,
            "prompt": row["prompt"],  # text, or a conversation's turns
            "answer": str(row.get("answer")),
            "completion": output.rollout.texts[i],
            "reward": output.rewards[i],
        }
        if traces is not None:
            record["tool_calls"] = traces[i].calls
        records.append(record)
    log.samples(step, records)


def _finish(
    console: Console, run_dir: Path, result: TrainResult, events: list[dict[str, Any]]
) -> None:
    """The run's summary.json, the held-out change and where the run folder is."""
    write_summary(run_dir, result, events)
    if 0 in result.heldout and len(result.heldout) > 1:  # with answered and any-form beside
        console.print(heldout_change(run_dir, result.heldout), highlight=False)
    console.print(f"run folder: {run_dir}", highlight=False)


def run_sft_only(
    recipe: Recipe, recipe_yaml: str, *, run_dir: Path, console: Console | None = None
) -> Path:
    """`gspo sft`: the cold start alone, saved as an HF checkpoint, with held-out accuracy."""
    console = console or Console(markup=False, highlight=False)  # paths verbatim
    allow_weak_isolation(recipe.reward.sandbox.allow_weak_isolation)  # held-out code problems
    # a GGUF (or a LoRA checkpoint's GGUF base) is converted or refused before the run folder
    convert_first(recipe.model.path, what="model.path")
    prepare_run_dir(run_dir, False, recipe_yaml)
    device = resolve_device(recipe.trainer.device)
    model, tokenizer = load_recipe_model(recipe)
    environments = load_environments(recipe, tokenizer)
    for line in environments.notes:
        console.print(line, highlight=False, soft_wrap=True)
    model = run_cold_start(
        recipe, model.to(device), tokenizer, environments.cold_start_set(), run_dir, console
    ).to(device)
    engine = HFGenerateEngine(model, tokenizer)
    with MathVerifierPool(recipe.reward.num_workers, recipe.reward.timeout_s) as math_pool:
        values = {
            env.name: heldout_accuracy(
                engine,
                tokenizer,
                env.heldout,
                eval_params(env.recipe),
                recipe.trainer.seed + 7,
                math_pool,
                eval_format(env.recipe),
            )
            for env in environments.environments
        }
    several = environments.several
    values = mixed_heldout(environments.environments, values) if several else values["main"]
    RunLog(run_dir).evaluation(0, values)
    console.print(f"held-out accuracy after cold start: {values['accuracy']:.1%}", highlight=False)
    console.print(f"HF checkpoint: {run_dir / COLD_START}", highlight=False)
    return run_dir / COLD_START
