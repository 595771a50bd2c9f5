"""Asynchronous rollouts, the trainer's side: one rollout worker per rank (worker.py).

With `rollout.max_staleness` N > 0 the trainer takes each step's batch from its worker, which
has been sampling it while earlier steps trained, and after each step publishes its weights
through a staging model in shared memory. Under DeepSpeed every rank runs its own worker on
its share of the prompts (one per rank; ZeRO-3 gathers the weights for it).

A checkpoint at step k waits for the batches of steps k+1..k+N (sampled by policies older
than the checkpoint's weights, so not reproducible from it) and saves them with it: `--resume`
trains on exactly those, then the worker goes on from the checkpoint's weights and the data
position after them, as the uninterrupted run did. A rollback discards them and restarts the
worker from the restored weights, with the rollback's fresh seeds.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.schema import Recipe
from gspo_cli.train.async_rollouts.worker import AsyncBatch, WorkerPlan, worker_main
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.torch_engine import TrainEngine
from gspo_cli.train.step.environments import EnvironmentPlan
from gspo_cli.train.step.sampler import MixtureSampler
from gspo_cli.train.step.settings import StepSettings

STARTUP_S = 600.0  # the least a worker is given to start (imports, engine: vLLM takes ~45 s)
STOP_GRACE_S = 10.0  # a worker asked to stop ends within this, or is killed
POLL_S = 1.0  # how often a waiting trainer checks that its worker is alive


def in_flight_file(folder: Path, rank: int) -> Path:
    return folder / f"rollouts_in_flight_rank{rank}.pt"


def staging_model(engine: TrainEngine, trust_remote_code: bool) -> nn.Module:
    """A plain copy of the policy (LoRA merged in) in shared memory, which the worker reads."""
    weights = {name: t.detach().to("cpu", copy=True) for name, t in engine.full_weights()}
    dtype = next(iter(weights.values())).dtype
    try:
        model = AutoModelForCausalLM.from_config(
            engine.model.config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    except (ValueError, OSError) as exc:
        raise GspoError(
            f"rollout.max_staleness: cannot build the rollout worker's copy of the model: {exc}"
        ) from None
    result = model.load_state_dict(weights, strict=False)
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {
        name for name, _ in model.named_parameters()
    }
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise GspoError(
            "rollout.max_staleness: the rollout worker's copy of the model does not match the "
            f"policy's weights (missing {sorted(set(result.missing_keys) - tied)[:3]}, "
            f"unexpected {result.unexpected_keys[:3]})"
        )
    try:
        return model.eval().requires_grad_(False).share_memory()
    except (RuntimeError, OSError) as exc:  # /dev/shm too small, or too many open files
        raise GspoError(
            f"rollout.max_staleness: cannot put the policy in shared memory ({exc}): check the "
            "free space of /dev/shm (docker run --shm-size) and ulimit -n"
        ) from None


class AsyncRollouts:
    """This rank's rollout worker: batches in, weights out."""

    def __init__(
        self,
        recipe: Recipe,
        engine: TrainEngine,
        tokenizer: PreTrainedTokenizerBase,
        problems: tuple[list[list[int]], list[dict[str, Any]]],
        environments: tuple[list[EnvironmentPlan], MixtureSampler],
        settings: StepSettings,
        ctx: DistContext,
        device: torch.device,
        note: Callable[[str], None] = print,
    ) -> None:
        self.recipe, self.engine, self.ctx = recipe, engine, ctx
        self.note = note  # the worker's lines (its dynamic-sampling rounds), as the loop's
        self.staleness = recipe.rollout.max_staleness
        self.last_step = recipe.trainer.steps
        self._plan_parts = (problems, environments, tokenizer, settings, str(device))
        self._staging: nn.Module | None = None
        self._process: Any = None
        self.pending: dict[int, AsyncBatch] = {}
        self.taken = 0  # the newest version the worker copied
        self.plan: WorkerPlan | None = None
        self.ready = False

    # --- starting and stopping -----------------------------------------------------------

    def start(
        self,
        after_step: int,
        rollbacks: int,
        sampler_state: dict[str, Any],
        saved: list[AsyncBatch] | None = None,
    ) -> None:
        """A worker that samples from the current weights (those after step `after_step`) the
        steps after `after_step` and after the `saved` batches (a resume's), from
        `sampler_state` (the data position after step `after_step`)."""
        self.close()
        saved = saved or []
        if self._staging is None:  # collective under ZeRO-3
            self._staging = staging_model(self.engine, self.recipe.model.trust_remote_code)
        else:
            self._write_staging()
        problems, (plans, sampler), tokenizer, settings, device = self._plan_parts
        self.plan = WorkerPlan(
            self.recipe, problems, plans, sampler, tokenizer, settings,
            DistContext(self.ctx.rank, self.ctx.world),
            self.engine.capabilities, device, after_step + 1 + len(saved), self.last_step,
            after_step, rollbacks, saved[-1].sampler_after if saved else sampler_state,
            os.getpid(),
        )  # fmt: skip
        self.pending = {batch.step: batch for batch in saved}
        self.taken = after_step
        self.ready = False  # until the worker has copied the staging model and built its engine
        if self.plan.first_step > self.last_step:  # the saved batches are all that is left
            return
        spawn = multiprocessing.get_context("spawn")  # a fork would copy the trainer's threads
        self._inbox, self._outbox = spawn.Queue(), spawn.Queue()
        # not a daemon: the worker has children of its own (reward pools); it dies with the
        # trainer (PR_SET_PDEATHSIG) and `close` ends it
        self._process = spawn.Process(
            target=worker_main,
            args=(self.plan, self._staging, self._inbox, self._outbox),
            name=f"gspo-rollout-worker-{self.ctx.rank}",
        )
        self._process.start()

    def close(self) -> None:
        """End the worker: asked to stop, it closes its engine and pools when it next waits
        for weights; one still sampling after STOP_GRACE_S is killed (its children die
        with it)."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.is_alive():
                self._inbox.put(("stop", None))
                process.join(STOP_GRACE_S)
        finally:
            if process.is_alive():
                process.kill()
                process.join()
        for channel in (self._inbox, self._outbox):
            channel.cancel_join_thread()  # what is still queued is of no use now
            channel.close()

    # --- batches in ----------------------------------------------------------------------

    def take(self, step: int) -> tuple[AsyncBatch, float]:
        """Step `step`'s batch, and the seconds the trainer waited for it."""
        started = time.perf_counter()
        while step not in self.pending:
            self._receive(f"step {step}'s batch")
        return self.pending.pop(step), time.perf_counter() - started

    def in_flight(self, step: int) -> list[AsyncBatch]:
        """The batches of steps step+1..step+N, waited for (a checkpoint at `step` saves them)."""
        steps = range(step + 1, min(step + self.staleness, self.last_step) + 1)
        for later in steps:
            while later not in self.pending:
                self._receive(f"step {later}'s batch (checkpoint {step} saves it)")
        return [self.pending[later] for later in steps]

    def _receive(self, what: str) -> None:
        """Handle one message from the worker; one line, naming it, if it died or hung."""
        assert self._process is not None and self.plan is not None
        timeout = self.recipe.rollout.worker_timeout_s
        if not self.ready:
            timeout = max(timeout, STARTUP_S)
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, value = self._outbox.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._process.is_alive():
                    with contextlib.suppress(queue.Empty):  # what it sent before it ended
                        kind, value = self._outbox.get(timeout=POLL_S)
                        break
                    raise self._failure(
                        f"died (exit code {self._process.exitcode}) while sampling {what}"
                    ) from None
                if time.monotonic() > deadline:
                    raise self._failure(
                        f"sent nothing for {timeout:g}s ({self._limit()}) while sampling "
                        f"{what}: it hangs"
                    ) from None
        if kind == "error":
            raise self._failure(f"stopped while sampling {what}: {value}")
        if kind == "note":
            self.note(str(value))
        elif kind == "ready":
            self.ready = True
        elif kind == "took":
            self.taken = int(value)
        else:
            batch: AsyncBatch = pickle.loads(value)
            self.pending[batch.step] = batch

    def _limit(self) -> str:
        if self.ready:
            return "rollout.worker_timeout_s"
        return f"starting, at least {STARTUP_S:g}s or rollout.worker_timeout_s"

    def _failure(self, problem: str) -> GspoError:
        pid = self._process.pid if self._process is not None else "?"
        self.close()
        return GspoError(
            f"rollout worker {self.ctx.rank} (pid {pid}) {problem}; the run resumes from its "
            "last checkpoint with --resume"
        )

    # --- weights out ---------------------------------------------------------------------

    def publish(self, version: int) -> None:
        """The weights after step `version`, for the batches that sample from them (every
        rank calls it: gathering the weights is collective under ZeRO-3)."""
        if version + 1 + self.staleness > self.last_step:  # no batch left samples from it
            return
        assert self.plan is not None
        # the worker must have copied the staging model (at its start) and the previous version
        previous = version - 1 if version - 1 >= self.plan.start_version else -1
        while not self.ready or self.taken < previous:
            self._receive(f"step {version + self.staleness}'s batch")
        self._write_staging()
        self._inbox.put(("version", version))

    def _write_staging(self) -> None:
        assert self._staging is not None
        staging = self._staging.state_dict()
        with torch.no_grad():
            for name, tensor in self.engine.full_weights():
                staging[name].copy_(tensor)

    # --- checkpoints ---------------------------------------------------------------------

    def saver(self, step: int) -> Any:
        """What a checkpoint at `step` writes into its folder on this rank: the in-flight
        batches (waited for now), with the settings that decide whether a resume can use them."""
        batches = self.in_flight(step)
        rollbacks = self.plan.rollbacks if self.plan is not None else 0
        record = {
            "max_staleness": self.staleness,
            "rollbacks": rollbacks,
            "world": self.ctx.world,
            "batches": batches,
        }

        def write(folder: Path) -> None:
            torch.save(record, in_flight_file(folder, self.ctx.rank))

        return write


def saved_in_flight(
    folder: Path, rank: int, staleness: int, rollbacks: int, world: int = 1
) -> list[AsyncBatch]:
    """The in-flight batches checkpoint `folder` saved for this rank, when a resume with these
    settings samples them again; [] otherwise (the worker then starts from the checkpoint)."""
    file = in_flight_file(folder, rank)
    if not file.is_file():
        return []
    try:
        record = torch.load(file, weights_only=False)
    except Exception as exc:  # pickle/zip errors of many kinds all mean a corrupted file
        raise GspoError(f"checkpoint {file} is corrupted: {exc}") from None
    saved_with = (record["max_staleness"], record["rollbacks"], record.get("world", 1))
    if saved_with != (staleness, rollbacks, world):  # another schedule, or other rank shares
        return []
    batches: list[AsyncBatch] = record["batches"]
    return batches
