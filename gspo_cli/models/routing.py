"""See and force which experts an HF Mixture-of-Experts model routes each token to.

Routing Replay (GSPO paper, section 4.3) needs two things from a MoE model: the top-k experts
every token went to in one forward, and a later forward that uses exactly those experts while the
router's weights still come from the current parameters (so the router keeps its gradient).

The mechanism is general, not a patch of one architecture. Since transformers 5, every MoE
block hands its experts module `(hidden_states, top_k_index, top_k_weights)`; a pre-hook on that
module sees the experts each token actually used. To force experts, the router's own `topk`
call (seen through a `TorchFunctionMode` active only inside the router) returns the cached
indices, and the values at those indices from its own input: whatever the router does next
(renormalising, bias-free scoring as in DeepSeek-V3, scaling) runs unchanged on the forced
choice. The experts pre-hook then checks that the forced experts arrived; a router this cannot
reach fails loudly instead of silently not replaying.

DeepSpeed's expert parallelism (AutoEP) replaces each MoE block by an `AutoEPMoELayer` whose
`router` picks global expert ids with `torch.topk` over every expert before the all-to-all that
takes tokens to the rank holding each expert: there the router's output is the choice, recorded
and checked by a hook on the router itself, and the aux loss reads its `gate` (the logits).

Layouts: a forward of `n` rows by `W` positions reaches each MoE layer as `n * W` flattened
tokens (row-major); a `generate` call reaches it once per decoding step. A routing is an
int16 tensor `[L, n, W, k]` (L = MoE layers, k = experts per token).
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from transformers import PretrainedConfig, PreTrainedModel

# The config names of the routed-expert count (Qwen-MoE, Mixtral, DeepSeek). recipe/bounds.py
# reads the same names from a config.json before any model loads (a layer above: a test keeps
# the two equal).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
ROUTER_NAMES = ("gate", "router")  # the router child of a MoE block, by transformers' convention
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, ExpertRouting] = weakref.WeakKeyDictionary()


def num_experts(config: PretrainedConfig) -> int:
    """Routed experts per layer under any of the config names in use (0 for a dense model)."""
    for name in EXPERT_COUNT_KEYS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 1:
            return value
    return 0


def is_moe(config: PretrainedConfig) -> bool:
    return num_experts(config) > 1


class RoutingError(RuntimeError):
    """The model's MoE layers cannot be observed or forced by this mechanism."""


class _ForcedTopK(TorchFunctionMode):
    """Inside a router: `topk` over the experts returns the forced experts where given."""

    def __init__(self, layer: _Layer) -> None:
        super().__init__()
        self.layer = layer

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func not in (torch.topk, torch.Tensor.topk):
            return result
        scores = args[0]  # [..., E]
        k = kwargs.get("k", args[1] if len(args) > 1 else None)
        if scores.shape[-1] != self.layer.experts or k != self.layer.top_k:
            return result  # another topk (e.g. DeepSeek-V3's group choice): not the routing
        return self.layer.force(scores, result)


class _Layer:
    """One MoE layer: its experts module (the pre-hook) and the router scope (forcing)."""

    def __init__(self, index: int, owner: ExpertRouting, experts: int, top_k: int) -> None:
        self.index, self.owner, self.experts, self.top_k = index, owner, experts, top_k
        self.mode: _ForcedTopK | None = None
        self.in_router = False  # inside an AutoEP router's forward

    def enter_router(self, _module: nn.Module, _args: Any) -> None:
        if self.owner.forced is not None:
            self.mode = _ForcedTopK(self)
            self.mode.__enter__()

    def leave_router(self, _module: nn.Module, _args: Any, output: Any) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None
        if self.owner.router_logits is not None:  # routers return (logits, weights, indices)
            self.owner.router_logits.append(output[0])

    def force(self, scores: torch.Tensor, natural: Any) -> Any:
        """The router's topk result with the forced experts put in (values from `scores`)."""
        owner = self.owner
        assert owner.forced is not None and owner.forced_where is not None
        indices = natural.indices  # [tokens, k] or [n, W, k]
        owner.record_natural(self.index, indices)
        forced = owner.forced[self.index].reshape(indices.shape).to(indices.device, indices.dtype)
        where = owner.forced_where.reshape(indices.shape[:-1]).unsqueeze(-1).to(indices.device)
        chosen = torch.where(where, forced, indices)
        return torch.return_types.topk((scores.gather(-1, chosen), chosen))

    def enter_autoep_router(self, module: nn.Module, args: Any) -> None:
        self.in_router = True
        self.enter_router(module, args)

    def leave_autoep_router(self, module: nn.Module, args: Any, output: Any) -> None:
        """Forward hook of an AutoEP router (`(scores, experts, counts)`, global expert ids over
        every expert, before dispatch): leave the forcing scope, record and check the choice."""
        self.in_router = False
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None
        self.before_experts(module, (None, output[1]), {})

    def gate_logits(self, _module: nn.Module, _args: Any, output: torch.Tensor) -> None:
        """Forward hook of an AutoEP router's gate: the router logits for the aux loss (only
        the router's own call: the layer may run the gate again for its logits output)."""
        if self.in_router and self.owner.router_logits is not None:
            self.owner.router_logits.append(output)

    def before_experts(
        self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Pre-hook of the experts module: record (and check) the experts actually used."""
        owner = self.owner
        if not owner.active:
            return
        used = kwargs["top_k_index"] if "top_k_index" in kwargs else args[1]  # [tokens, k]
        if owner.forced is not None:
            assert owner.forced_where is not None
            where = owner.forced_where.reshape(-1).to(used.device)
            want = owner.forced[self.index].reshape(-1, used.shape[-1]).to(used.device)
            if not torch.equal(used.reshape(-1, used.shape[-1])[where], want[where].to(used.dtype)):
                raise RoutingError(
                    f"routing replay did not reach MoE layer {self.index} "
                    f"({type(_module).__name__}): its router does not choose experts by topk"
                )
        else:
            owner.record_natural(self.index, used)
        owner.record_used(self.index, used)


class Recording:
    """What the MoE layers saw during a `record()` block: one entry per layer call."""

    def __init__(self, layers: int) -> None:
        self.natural: list[list[torch.Tensor]] = [[] for _ in range(layers)]  # router's own choice
        self.used: list[list[torch.Tensor]] = [[] for _ in range(layers)]  # what the experts got

    def routing(self, rows: int, which: str = "used") -> torch.Tensor:
        """`[L, rows, W, k]` int16: the calls of each layer laid out as rows x positions and
        joined along positions (one call for a forward; one per decoding step in `generate`)."""
        calls = self.used if which == "used" else self.natural
        return torch.stack(
            [torch.cat([c.reshape(rows, -1, c.shape[-1]) for c in layer], dim=1) for layer in calls]
        )


WRAPPED = "base_layer"  # where an adapter (peft LoRA) wrapper holds the module it adapts


def _moe_block(modules: dict[str, nn.Module], path: str, name: str) -> tuple[nn.Module, str]:
    """The MoE block whose experts are the child `name` of the module at `path`, and the
    experts' name in it: above any adapter wrappers (LoRA on the experts' parameters wraps them,
    once per parameter), where the router is found."""
    while name == WRAPPED and path:
        path, _, name = path.rpartition(".")
    return modules[path], name


class ExpertRouting:
    """Hooks on every MoE layer of one model; idle (one cheap check per layer) unless asked."""

    def __init__(self, model: nn.Module, config: PretrainedConfig) -> None:
        experts, top_k = num_experts(config), int(getattr(config, "num_experts_per_tok", 0))
        self.layers: list[_Layer] = []
        self.recording: Recording | None = None
        self.forced: torch.Tensor | None = None  # [L, n, W, k]
        self.forced_where: torch.Tensor | None = None  # [n, W] bool: positions to force
        self.router_logits: list[torch.Tensor] | None = None  # per layer [tokens, E], with grad
        self.named_routers = True
        modules = dict(model.named_modules())
        for inner in modules.values():
            if getattr(inner, "_is_autoep_layer", False):  # DeepSpeed AutoEP: hook its router
                layer = _Layer(len(self.layers), self, experts, top_k)
                inner.router.register_forward_pre_hook(layer.enter_autoep_router)
                inner.router.register_forward_hook(layer.leave_autoep_router)
                inner.router.gate.register_forward_hook(layer.gate_logits)
                self.layers.append(layer)
        for path, inner in modules.items():  # (an AutoEP layer's children take no top_k_index)
            for child_name, child in inner.named_children():
                if "top_k_index" not in inspect.signature(child.forward).parameters:
                    continue
                block, name = _moe_block(modules, path, child_name)
                layer = _Layer(len(self.layers), self, experts, top_k)
                child.register_forward_pre_hook(layer.before_experts, with_kwargs=True)
                router = next(
                    (getattr(block, n) for n in ROUTER_NAMES if hasattr(block, n) and n != name),
                    block,  # no named router: force inside the whole block
                )
                self.named_routers &= router is not block
                router.register_forward_pre_hook(layer.enter_router)
                router.register_forward_hook(layer.leave_router)
                self.layers.append(layer)
        if not self.layers or not top_k:
            raise RoutingError(
                f"{type(model).__name__}: no MoE layer whose experts take `top_k_index` "
                "(transformers >= 5 MoE layout) and a config with num_experts_per_tok"
            )

    @classmethod
    def of(cls, model: PreTrainedModel) -> ExpertRouting | None:
        """The model's routing hooks (attached once), or None for a dense model."""
        if not is_moe(model.config):
            return None
        if model not in _ATTACHED:
            _ATTACHED[model] = cls(model, model.config)
        return _ATTACHED[model]

    @classmethod
    def forget(cls, model: nn.Module) -> None:
        """Drop the hooks' bookkeeping of `model` (its MoE blocks were replaced, as DeepSpeed's
        AutoEP does): the next `of` attaches to the layers it has now."""
        _ATTACHED.pop(model, None)

    @property
    def active(self) -> bool:
        return self.recording is not None or self.forced is not None

    def record_natural(self, layer: int, indices: torch.Tensor) -> None:
        if self.recording is not None:
            self.recording.natural[layer].append(indices.detach().to("cpu", torch.int16))

    def record_used(self, layer: int, indices: torch.Tensor) -> None:
        if self.recording is not None:
            self.recording.used[layer].append(indices.detach().to("cpu", torch.int16))

    @contextmanager
    def record(self) -> Iterator[Recording]:
        """Record the routing of every forward inside the block."""
        self.recording = Recording(len(self.layers))
        try:
            yield self.recording
        finally:
            self.recording = None

    @contextmanager
    def replay(self, forced: torch.Tensor, where: torch.Tensor) -> Iterator[None]:
        """Forward passes inside the block route position `where` `[n, W]` to the experts in
        `forced` `[L, n, W, k]` (other positions route freely); one forward of that layout."""
        if forced.shape[0] != len(self.layers):
            raise RoutingError(f"routing of {forced.shape[0]} layers for {len(self.layers)}")
        self.forced, self.forced_where = forced, where.bool()
        try:
            yield
        finally:
            self.forced, self.forced_where = None, None

    @contextmanager
    def router_logits_of(self, model: nn.Module) -> Iterator[list[torch.Tensor]]:
        """Collect every router's logits (with grad) of the forwards inside the block."""
        if not self.named_routers:
            raise RoutingError(f"{type(model).__name__}: a MoE block without a gate/router child")
        self.router_logits = []
        try:
            yield self.router_logits
        finally:
            self.router_logits = None


def load_balancing_loss(
    model: PreTrainedModel, logits: list[torch.Tensor], attention_mask: torch.Tensor
) -> torch.Tensor:
    """The model's own auxiliary load-balancing loss (its modeling file's
    `load_balancing_loss_func`, the one HF adds under `router_aux_loss_coef`) over real tokens."""
    loss_func = getattr(sys.modules[type(model).__module__], "load_balancing_loss_func", None)
    if loss_func is None:
        raise RoutingError(f"{type(model).__name__} defines no load-balancing loss")
    config = model.config
    loss: torch.Tensor = loss_func(
        tuple(logits), num_experts(config), int(config.num_experts_per_tok), attention_mask
    )
    return loss


# -- per-sequence storage -------------------------------------------------------------------------


def split_rows(routing: torch.Tensor, real: torch.Tensor) -> list[torch.Tensor]:
    """`[L, n, W, k]` -> n tensors `[L, len_i, k]` holding only each row's real positions."""
    return [routing[:, i, real[i].bool()] for i in range(real.shape[0])]


def join_rows(rows: list[torch.Tensor], real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `split_rows` for a new layout: (`[L, n, W, k]`, where `[n, W]`).

    Row i's cached positions fill its real positions in order; a row may cover fewer positions
    than it has (the last sampled token is never forwarded while generating): those and the
    padding are left to the router (`where` False).
    """
    layers, k = rows[0].shape[0], rows[0].shape[-1]
    n, width = real.shape
    forced = torch.zeros((layers, n, width, k), dtype=torch.int16)
    where = torch.zeros((n, width), dtype=torch.bool)
    for i, cached in enumerate(rows):
        positions = real[i].bool().nonzero().squeeze(-1)[: cached.shape[1]]  # [len]
        forced[:, i, positions] = cached[:, : positions.numel()]
        where[i, positions] = True
    return forced, where


def volatility(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """`[L]` per layer: the mean share of a token's top-k experts that changed.

    `before`, `after`: `[L, tokens, k]` routings of the same tokens."""
    k = before.shape[-1]
    kept = (before.unsqueeze(-1) == after.unsqueeze(-2)).any(dim=-1).sum(dim=-1)  # [L, tokens]
    return 1.0 - kept.float().mean(dim=-1) / k
