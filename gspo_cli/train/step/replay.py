"""MoE routing inside one RL step: Routing Replay, the router's aux loss, expert volatility.

- Routing Replay (`algorithm.routing_replay`, GSPO paper section 4.3): `old_policy` (R2) records
  each token's top-k experts in the pi_old forward and forces them in every training forward of
  the step; `rollout` (R3) forces the experts chosen while generating, in the pi_old forward too.
  Every position of a sequence is forced, the prompt's included: prompt tokens reach the
  response's through attention, so freeing them would still move the response's routing.
- Expert volatility, as the paper defines it: the share of the same tokens' top-k experts that
  change across ONE optimiser update. Before update m, the router's own choice for a probe of
  minibatch m's sequences is recorded during their training forward (free: the choice is seen
  even when replay overrides it); after the update, one no-grad forward of the probe alone
  measures it again, under the same replay as before it (so a replayed upstream layer does not
  count as a change). Response tokens only; per update and per layer. `measure_volatility=False`
  (`StepSettings.measure_volatility`) leaves out the forward after an update and so the
  volatility metrics (the recording before the update still runs: the benchmarks that turn
  the probe off were measured so).

Dense models get a `StepRouting` that does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

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

PROBE_ROWS = 2  # sequences per update whose routing is measured again after it


def _response_routing(routing: torch.Tensor, batch: TrainBatch, rows: int) -> list[torch.Tensor]:
    """The first `rows` rows' experts of the model's response tokens (tool results left out),
    each `[L, model_tokens, k]`."""
    per_row = split_rows(routing[:, :rows], batch.attention_mask[:rows])
    response = batch.attention_mask[:rows, batch.prompt_width :]  # [rows, T] tool tokens too
    out = []
    for r, real, model in zip(per_row, response, batch.response_mask[:rows], strict=True):
        length = int(real.sum())
        out.append(r[:, r.shape[1] - length :][:, model[:length].bool()])
    return out


class StepRouting:
    """The routing plan of one step over its `n` sequences (rows of the step's TrainBatch)."""

    def __init__(
        self,
        model: PreTrainedModel,
        mode: str,
        n: int,
        rollout_routing: list[torch.Tensor] | None,
        aux_coef: float,
        *,
        records_routing: bool | None = None,
        measure_volatility: bool = True,
    ) -> None:
        self.model = model
        # `records_routing`: the engine's capabilities (None: the model's own, as in tests)
        if records_routing is None:
            records_routing = capabilities_of(model).records_routing
        self.routing = ExpertRouting.of(model) if records_routing else None
        self.measure_volatility = measure_volatility
        self.mode = mode if self.routing is not None else "off"
        self.aux_coef = aux_coef if self.routing is not None else 0.0
        # Per sequence `[L, positions, k]`: the experts every training forward is held to.
        self.cache: list[torch.Tensor | None] = [None] * n
        if self.mode == "rollout":
            if rollout_routing is None:
                raise ValueError("routing_replay rollout needs the rollout's routed experts")
            self.cache = list(rollout_routing)
        self.updates: list[torch.Tensor] = []  # per applied update `[L]` volatility
        self._probe: torch.Tensor | None = None  # rows measured across the coming update
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
        self, sub: TrainBatch, index: torch.Tensor, probe: torch.Tensor | None
    ) -> Iterator[list[torch.Tensor] | None]:
        """A training forward of rows `index`: replays the cached experts (R2/R3), records the
        router's own choice for the probe rows (the first rows of `index`, when given) and
        yields the routers' logits when the aux loss is on (else None)."""
        if self.routing is None:
            yield None
            return
        with ExitStack() as stack:
            if self.mode != "off":
                stack.enter_context(self._replay(sub, index))
            recording = stack.enter_context(self.routing.record()) if probe is not None else None
            logits = (
                stack.enter_context(self.routing.router_logits_of(self.model))
                if self.aux_coef > 0
                else None
            )
            yield logits
        if recording is not None and probe is not None:
            natural = recording.routing(len(index), "natural")
            self._probe = probe
            self._before = _response_routing(natural, sub, len(probe))

    def aux_loss(self, logits: list[torch.Tensor] | None, sub: TrainBatch) -> torch.Tensor | None:
        """`router_aux_coef` x the model's load-balancing loss over `sub`'s real tokens."""
        if logits is None:
            return None
        mask = sub.attention_mask.to(logits[0].device)
        return self.aux_coef * load_balancing_loss(self.model, logits, mask)

    @torch.no_grad()
    def after_update(self, batch: TrainBatch, applied: bool) -> None:
        """Measure the probe rows' routing again, now that the update is in the weights."""
        probe, self._probe = self._probe, None
        if self.routing is None or probe is None or not applied or not self.measure_volatility:
            return
        sub = batch.select(probe).trimmed()
        device = next(self.model.parameters()).device
        with ExitStack() as stack:
            if self.mode != "off":  # the same forced experts as before the update
                stack.enter_context(self._replay(sub, probe))
            recording = stack.enter_context(self.routing.record())
            self.model(
                input_ids=sub.input_ids.to(device),
                attention_mask=sub.attention_mask.to(device),
                position_ids=sub.position_ids.to(device),
                use_cache=False,
                logits_to_keep=1,  # only the routing is read
            )
        after = _response_routing(recording.routing(len(probe), "natural"), sub, len(probe))
        self.updates.append(volatility(torch.cat(self._before, 1), torch.cat(after, 1)))

    def metrics(self) -> dict[str, float]:
        """`expert_volatility` (mean over the step's updates and layers), per update and per
        layer; the replay setting itself is in the recipe."""
        if not self.updates:
            return {}
        per_update = torch.stack(self.updates)  # [updates, L]
        out = {"expert_volatility": float(per_update.mean())}
        out.update(
            {f"expert_volatility_update{m}": float(v.mean()) for m, v in enumerate(per_update)}
        )
        out.update(
            {f"expert_volatility_layer{i}": float(v) for i, v in enumerate(per_update.mean(0))}
        )
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
