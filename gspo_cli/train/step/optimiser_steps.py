"""A step's optimiser steps, one per minibatch of its plan: each micro-batch's training forward,
its loss and backward, over what the training phase prepared (`PreparedStep`, built once by
update.py before the updates)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from gspo_cli.algorithms import compute_policy_loss, loss_normalizer
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.torch_engine import TrainEngine
from gspo_cli.train.step.distill import token_signal
from gspo_cli.train.step.metrics import add_mismatch
from gspo_cli.train.step.micro import MicroBatch, StepPlan, rows_with_signal
from gspo_cli.train.step.old_policy import OldPolicy, PiOldInputs, check_first_forward
from gspo_cli.train.step.replay import StepRouting
from gspo_cli.train.step.settings import LossSettings, StepSettings


@dataclass
class PreparedStep:
    """What the updates of a step read, built once before them."""

    batch: TrainBatch
    splits: list[torch.Tensor]  # row indices of each minibatch
    routing: StepRouting
    inputs: PiOldInputs
    in_loss: torch.Tensor  # [N] bool: rows in the loss and its normalisers
    advantages: torch.Tensor  # [N]
    ref_lp: torch.Tensor | None = None  # [N, T] the reference policy's (KL penalty)
    kl_metrics: dict[str, float] = field(default_factory=dict)  # KL in the reward
    old: OldPolicy = field(init=False)
    loss_mask: torch.Tensor = field(init=False)  # [N, T] pi_old's mask, rows out of the loss 0
    plan: StepPlan = field(init=False)  # the step's one plan, set once the advantages are final
    turns: torch.Tensor | None = None  # [N, T] model turns, with sequence_unit: turn
    token_advantages: torch.Tensor | None = None  # [N, T] with distillation (distill.py)
    distill_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def loss_advantages(self) -> torch.Tensor:
        """`[N]` or `[N, T]`: what the losses take."""
        return self.advantages if self.token_advantages is None else self.token_advantages

    def set_old(self, old: OldPolicy) -> None:
        self.old = old
        self.loss_mask = old.loss_mask * self.in_loss.unsqueeze(1).to(old.loss_mask.dtype)

    def trained(self, skip_zero_advantage: bool) -> torch.Tensor:
        """`[N]` bool: the rows the updates take, from the final advantages."""
        if self.token_advantages is None:
            signal = self.advantages
        else:  # a row with a nonzero advantage on some model token
            signal = token_signal(self.token_advantages, self.batch.response_mask)
        return rows_with_signal(signal, skip_zero_advantage) & self.in_loss


@dataclass(frozen=True)
class _Forward:
    """One training micro-batch's forward: its rows and what it returned."""

    index: torch.Tensor  # [m] rows of the step's batch
    width: int  # its response width
    logprobs: torch.Tensor  # [m, width]
    entropy: torch.Tensor | None  # [m, width], when the forward returned it


def _micro_batch_loss(
    parts: dict[str, list[float]],
    prep: PreparedStep,
    loss_settings: LossSettings,
    forward: _Forward,
    norm: float,
    first_update: bool,
) -> torch.Tensor:
    """The policy loss of `forward`'s rows, normalised by the whole minibatch's `norm`; its
    metrics go to `parts`."""
    index, width, logprobs, entropy = (
        forward.index,
        forward.width,
        forward.logprobs,
        forward.entropy,
    )
    device = logprobs.device

    def rows(values: torch.Tensor) -> torch.Tensor:  # [m, width] of an [N, T] tensor
        return values[index, :width].to(device)

    mask, old = rows(prep.loss_mask), rows(prep.old.logprobs)
    tokens = mask.sum().clamp(min=1)
    if first_update:  # nothing updated yet: pi must equal pi_old
        if entropy is not None:
            parts["entropy_before"].append(float((entropy.detach() * mask).sum() / tokens))
        parts["first_ratio_gap_max"].append(float(((logprobs.detach() - old) * mask).abs().max()))
        if prep.old.from_engine:
            add_mismatch(parts, logprobs, old, mask, loss_settings)
    advantages, ref_lp, weights, turns = (
        prep.loss_advantages,
        prep.ref_lp,
        prep.old.weights,
        prep.turns,
    )
    loss, metrics = compute_policy_loss(
        logprobs, old,
        (advantages[index] if advantages.dim() == 1 else rows(advantages)).to(device), mask,
        algorithm=loss_settings.name, clip_low=loss_settings.clip_low,
        clip_high=loss_settings.clip_high, loss_agg=loss_settings.aggregation, normalizer=norm,
        ref_logprobs=None if ref_lp is None else rows(ref_lp),
        kl_coef=loss_settings.kl.loss_coef, kl_estimator=loss_settings.kl.estimator,
        entropy=entropy, entropy_coef=loss_settings.entropy_coef,
        token_weights=None if weights is None else rows(weights), options=loss_settings.options,
        turns=None if turns is None else rows(turns),
    )  # fmt: skip
    if entropy is not None:
        parts["entropy"].append(float((entropy.detach() * mask).sum() / tokens))
    parts["response_tokens"].append(float(mask.sum()))
    for key, value in metrics.items():
        parts[key].append(value)
    return loss


def take_optimiser_steps(
    engine: TrainEngine, prep: PreparedStep, settings: StepSettings, ctx: DistContext
) -> tuple[dict[str, list[float]], list[bool]]:
    """The step's optimiser steps, one per minibatch: their metric parts, and per minibatch
    whether the non-finite guard left its update out."""
    updates = _Updates(engine, prep, settings, ctx)
    updates.run()
    return updates.parts, updates.bad


class _Updates:
    """The step's optimiser steps, one per minibatch of the plan: their metric parts, and per
    minibatch whether the non-finite guard left its update out (`bad`)."""

    def __init__(
        self, engine: TrainEngine, prep: PreparedStep, settings: StepSettings, ctx: DistContext
    ) -> None:
        self.engine, self.prep, self.settings, self.ctx = engine, prep, settings, ctx
        self.parts: dict[str, list[float]] = defaultdict(list)
        self.bad: list[bool] = []

    def run(self) -> None:
        prep = self.prep
        for number, (minibatch, micro_batches) in enumerate(
            zip(prep.splits, prep.plan.minibatches, strict=True)
        ):
            self._minibatch(number, minibatch, micro_batches)

    def _minibatch(
        self, number: int, minibatch: torch.Tensor, micro_batches: list[MicroBatch]
    ) -> None:
        prep, ctx, parts = self.prep, self.ctx, self.parts
        # every row in the loss counts in the normaliser, trained or not: the gradient stays
        turns = None if prep.turns is None else prep.turns[minibatch]
        aggregation = self.settings.algorithm.loss.aggregation
        norm = ctx.all_reduce_sum(loss_normalizer(prep.loss_mask[minibatch], aggregation, turns))
        minibatch_loss, bad_minibatch = 0.0, False
        trained = [m.rows for m in micro_batches if not m.filler]
        prep.routing.before_update(
            prep.batch, torch.cat(trained) if trained else torch.tensor([], dtype=torch.long),
            stand_in=int(micro_batches[0].rows[0]),
        )  # fmt: skip
        for part, micro in enumerate(micro_batches):
            loss = self._micro_batch(micro, len(minibatch), norm, first_update=number == 0)
            finite = ctx.all_reduce_sum(0.0 if torch.isfinite(loss) else 1.0) == 0.0
            # every rank takes the same decision
            self.engine.backward(loss if finite else None, boundary=part == len(micro_batches) - 1)
            bad_minibatch |= not finite
            minibatch_loss += ctx.all_reduce_sum(float(loss.detach()))  # global normaliser
        parts["loss"].append(minibatch_loss)
        grad_norm, applied = self.engine.step(skip=bad_minibatch)
        prep.routing.after_update(prep.batch, applied)  # MoE: volatility across this one update
        parts["grad_norm"].append(grad_norm)
        self.bad.append(not applied)

    def _micro_batch(
        self, micro: MicroBatch, minibatch_rows: int, norm: float, first_update: bool
    ) -> torch.Tensor:
        """One training forward's loss (times 0 for a filler, which keeps this rank in step
        with the others and adds nothing)."""
        prep, settings = self.prep, self.settings
        index, filler = micro
        sub = prep.batch.select(index).trimmed()
        width = sub.response_mask.shape[1]
        with prep.routing.training_forward(sub, index) as router_logits:
            logprobs, entropy = self.engine.logprobs(
                sub, settings.sampling.temperature,
                entropy=False if filler else settings.entropy_mode,
            )  # fmt: skip
        if prep.old.unchecked:  # `auto`: this forward, before any update, checks the engine's
            prep.set_old(
                check_first_forward(
                    prep.old, prep.inputs, settings.algorithm, logprobs, None if filler else index
                )
            )
        if filler:
            return logprobs.sum() * 0.0
        forward = _Forward(index, width, logprobs, entropy)
        loss = _micro_batch_loss(
            self.parts, prep, settings.algorithm.loss, forward, norm, first_update
        )
        aux = prep.routing.aux_loss(router_logits, sub)
        if aux is not None:  # the minibatch's mean over micro-batches and ranks
            loss = loss + aux * (len(index) / (minibatch_rows * self.ctx.world))
            self.parts["router_aux_loss"].append(float(aux.detach()))
        return loss
