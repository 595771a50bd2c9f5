"""MoE routing inside one RL step: Routing Replay, the router's aux loss, expert volatility.

- Routing Replay (`algorithm.routing_replay`, GSPO paper section 4.3): `old_policy` (R2) records
  each token's top-k experts in the pi_old forward and forces them in every training forward of
  the step; `rollout` (R3) forces the experts chosen while generating, in the pi_old forward too.
  Every position of a sequence is forced, the prompt's included: prompt tokens reach the
  response's through attention, so freeing them would still move the response's routing.
- Expert volatility, as the paper defines it: the share of the same tokens' top-k experts that
  change across ONE optimiser update. Around update m, two no-grad forwards of a probe (the
  first PROBE_ROWS trained rows of minibatch m, by global row index) read the router's own
  choice before and after it, under the same replay as training (so a replayed upstream layer
  does not count as a change). Response tokens only; per update and per layer. Each rank
  measures its own first rows; the ranks' measurements are gathered and the globally first
  PROBE_ROWS rows kept, so the metric is the same quantity, over the same tokens, at any world
  size. `measure_volatility=False` (`StepSettings.measure_volatility`) leaves both forwards out.

Dense models get a `StepRouting` that does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.models.forward.capabilities import capabilities_of
from gspo_cli.models.routing import (
    ExpertRouting,
    join_rows,
    load_balancing_loss,
    split_rows,
    volatility,
)
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.step.settings import RoutingSettings

PROBE_ROWS = 2  # rows per update whose routing is measured before and after it


class ProbeRow(NamedTuple):
    """One probe row's routing change across an update."""

    row: int  # global row index (the same row at any world size)
    changed: list[float]  # [L] sum over its model tokens of the share of top-k experts changed
    tokens: int  # its model tokens


def _response_routing(routing: torch.Tensor, batch: TrainBatch) -> list[torch.Tensor]:
    """Each row's experts at the model's response tokens (tool results left out), `[L, t, k]`."""
    rows = batch.input_ids.shape[0]
    per_row = split_rows(routing[:, :rows], batch.attention_mask)
    response = batch.attention_mask[:, batch.prompt_width :]  # [rows, T] tool tokens too
    out = []
    for r, real, model in zip(per_row, response, batch.response_mask, strict=True):
        length = int(real.sum())
        out.append(r[:, r.shape[1] - length :][:, model[:length].bool()])
    return out


class StepRouting:
    """The routing plan of one step over its `n` sequences (rows of the step's TrainBatch)."""

    def __init__(
        self,
        model: PreTrainedModel,
        settings: RoutingSettings,
        n: int,
        rollout_routing: list[torch.Tensor] | None,
        *,
        records_routing: bool | None = None,
        measure_volatility: bool = True,
        first_row: int = 0,
    ) -> None:
        self.model = model
        # `records_routing`: the engine's capabilities (None: the model's own, as in tests)
        if records_routing is None:
            records_routing = capabilities_of(model).records_routing
        self.routing = ExpertRouting.of(model) if records_routing else None
        self.measure_volatility = measure_volatility
        self.mode = settings.replay if self.routing is not None else "off"
        self.aux_coef = settings.aux_coef if self.routing is not None else 0.0
        # Per sequence `[L, positions, k]`: the experts every training forward is held to.
        self.cache: list[torch.Tensor | None] = [None] * n
        if self.mode == "rollout":
            if rollout_routing is None:
                raise ValueError("routing_replay rollout needs the rollout's routed experts")
            self.cache = list(rollout_routing)
        self.first_row = first_row  # the global index of this rank's row 0
        self.updates: list[list[ProbeRow]] = []  # per applied update, this rank's probe rows
        self._probe: torch.Tensor | None = None  # rows measured across the coming update
        self._counts = False  # whether they are rows the loss trained (not a rank's stand-in)
        self._before: list[torch.Tensor] = []

    @property
    def is_moe(self) -> bool:
        return self.routing is not None

    @contextmanager
    def old_policy_forward(self, sub: TrainBatch, index: torch.Tensor) -> Iterator[None]:
        """The pi_old forward of rows `index` (`sub` their trimmed batch): R2 records their
        experts, R3 replays the rollout's."""
        if self.routing is None or self.mode == "off":
            yield
            return
        if self.mode == "rollout":
            with self._replay(sub, index):
                yield
            return
        with self.routing.record() as recording:
            yield
        rows = split_rows(recording.routing(len(index)), sub.attention_mask)
        for i, row in zip(index.tolist(), rows, strict=True):
            self.cache[i] = row

    @contextmanager
    def training_forward(
        self, sub: TrainBatch, index: torch.Tensor
    ) -> Iterator[list[torch.Tensor] | None]:
        """A training forward of rows `index`: replays the cached experts (R2/R3) and yields
        the routers' logits when the aux loss is on (else None)."""
        if self.routing is None:
            yield None
            return
        with ExitStack() as stack:
            if self.mode != "off":
                stack.enter_context(self._replay(sub, index))
            yield (
                stack.enter_context(self.routing.router_logits_of(self.model))
                if self.aux_coef > 0
                else None
            )

    def aux_loss(self, logits: list[torch.Tensor] | None, sub: TrainBatch) -> torch.Tensor | None:
        """`router_aux_coef` x the model's load-balancing loss over `sub`'s real tokens."""
        if logits is None:
            return None
        mask = sub.attention_mask.to(logits[0].device)
        return self.aux_coef * load_balancing_loss(self.model, logits, mask)

    def before_update(self, batch: TrainBatch, trained: torch.Tensor, stand_in: int) -> None:
        """Measure the router's own choice for the probe of the coming update: the first
        PROBE_ROWS of `trained` (this rank's rows the update trains) by row index. A rank that
        trains none measures row `stand_in` (its filler), uncounted, so that every rank runs
        the same forwards (ZeRO-3 gathers parameters in each)."""
        if self.routing is None or not self.measure_volatility:
            return
        self._counts = len(trained) > 0
        probe = trained.sort().values[:PROBE_ROWS] if self._counts else torch.tensor([stand_in])
        self._probe = probe
        self._before = self._natural_routing(batch, self._probe)

    def after_update(self, batch: TrainBatch, applied: bool) -> None:
        """Measure the probe's routing again, now that the update is in the weights."""
        probe, self._probe = self._probe, None
        if probe is None or not applied:
            return
        after = self._natural_routing(batch, probe)
        rows = [
            ProbeRow(
                self.first_row + int(row), (volatility(b, a) * b.shape[1]).tolist(), b.shape[1]
            )
            for row, b, a in zip(probe.tolist(), self._before, after, strict=True)
        ]
        self.updates.append(rows if self._counts else [])

    @torch.no_grad()
    def _natural_routing(self, batch: TrainBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """The router's own choice at the model tokens of `rows` (each `[L, t, k]`), in a
        forward under the step's replay."""
        assert self.routing is not None
        sub = batch.select(rows).trimmed()
        device = next(self.model.parameters()).device
        with ExitStack() as stack:
            if self.mode != "off":  # the same forced experts as training
                stack.enter_context(self._replay(sub, rows))
            recording = stack.enter_context(self.routing.record())
            self.model(
                input_ids=sub.input_ids.to(device),
                attention_mask=sub.attention_mask.to(device),
                position_ids=sub.position_ids.to(device),
                use_cache=False,
                logits_to_keep=1,  # only the routing is read
            )
        return _response_routing(recording.routing(len(rows), "natural"), sub)

    def metrics(self, ctx: DistContext) -> dict[str, float]:
        """`expert_volatility` (mean over the step's updates and layers), per update and per
        layer, over the globally first PROBE_ROWS trained rows of each update (every rank's
        probe gathered: the same on every rank, at any world size); the replay setting itself
        is in the recipe."""
        if self.routing is None or not self.updates:
            return {}
        per_rank = ctx.all_gather(self.updates)  # every rank measured every applied update
        per_update = []  # [L] each
        for update in zip(*per_rank, strict=True):
            probe = sorted(row for rank in update for row in rank)[:PROBE_ROWS]
            tokens = sum(row.tokens for row in probe)
            if tokens:
                changed = torch.tensor([row.changed for row in probe], dtype=torch.float64)
                per_update.append(changed.sum(0) / tokens)
        if not per_update:
            return {}
        stacked = torch.stack(per_update)  # [updates, L]
        out = {"expert_volatility": float(stacked.mean())}
        out.update({f"expert_volatility_update{m}": float(v.mean()) for m, v in enumerate(stacked)})
        out.update({f"expert_volatility_layer{i}": float(v) for i, v in enumerate(stacked.mean(0))})
        return out

    @contextmanager
    def _replay(self, sub: TrainBatch, index: torch.Tensor) -> Iterator[None]:
        assert self.routing is not None
        rows = [self.cache[i] for i in index.tolist()]
        if any(row is None for row in rows):
            raise RuntimeError("routing replay: no cached experts for a sequence of this step")
        forced, where = join_rows([r for r in rows if r is not None], sub.attention_mask)
        with self.routing.replay(forced, where):
            yield
