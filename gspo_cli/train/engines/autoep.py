"""DeepSpeed AutoEP (expert parallelism) around the DeepSpeed engine: the optimizer it needs
and the way back from its sharded layers to the HF model's own weights.

AutoEP replaces each MoE block by an `AutoEPMoELayer`: the router becomes `router.gate` (aliased
as `gate`, which the state dict repeats), and the experts become `experts.w1` / `w2` / `w3`
`[E_local, ...]`, holding only this rank's share of the experts (contiguous: rank r of the
expert-parallel group holds experts `r * E_local` onwards). `hf_weights` gathers the experts
over that group and rebuilds the HF layout (`gate_up_proj` = w1 and w3 joined along the
intermediate axis, `down_proj` = w2), so every consumer of the engine's weights (the HF export,
the reference model, vLLM) sees a plain HF model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gspo_cli.train.engines.optimiser import adamw_with_schedule
from gspo_cli.train.engines.settings import EngineSettings

EXPERTS = ("w1", "w2", "w3")  # gate_proj, down_proj, up_proj of every local expert
# AutoEP's names of the Qwen2/Qwen3-MoE shared expert -> the HF model's
SHARED = {"shared_experts_gate": "shared_expert_gate", "shared_experts": "shared_expert"}


def autoep_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The model's AutoEP layers by module path (none without expert parallelism)."""
    return {
        path: module
        for path, module in model.named_modules()
        if getattr(module, "_is_autoep_layer", False)
    }


def autoep_optimizer(
    settings: EngineSettings,
) -> tuple[Callable[[Any], torch.optim.Optimizer], Callable[[torch.optim.Optimizer], Any]]:
    """The recipe's AdamW and schedule as the callables `deepspeed.initialize` takes: DeepSpeed
    calls them after AutoEP has replaced the MoE blocks, and ZeRO wants the expert parameters
    in their own 'moe' param groups (`configure_moe_param_groups`)."""
    from deepspeed.moe.utils import configure_moe_param_groups

    built: dict[str, Any] = {}

    def optimizer(params: Any) -> torch.optim.Optimizer:
        trainable = [p for p in params if p.requires_grad]
        opt, built["scheduler"] = adamw_with_schedule(
            configure_moe_param_groups(trainable),
            settings.optimizer,
            settings.optimizer_steps,
        )
        return opt

    def scheduler(opt: torch.optim.Optimizer) -> Any:
        return built["scheduler"]  # the schedule built on `opt` (the same optimizer)

    return optimizer, scheduler


def _gather_experts(layer: Any, local: torch.Tensor) -> torch.Tensor:
    """`[E_local, ...]` on each rank of the layer's expert-parallel group -> `[E, ...]`."""
    ranks = int(layer.ep_size)
    if ranks == 1:
        return local
    local = local.contiguous()
    parts = [torch.empty_like(local) for _ in range(ranks)]
    dist.all_gather(parts, local, group=layer.ep_group)
    return torch.cat(parts, dim=0)


def _split(name: str, layers: dict[str, nn.Module]) -> tuple[str, nn.Module | None, str]:
    """(layer path, AutoEP layer or None, name inside it)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:i])
        if path in layers:
            return path, layers[path], ".".join(parts[i:])
    return "", None, name


def hf_weights(model: nn.Module, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights under the HF model's own names and layout, experts whole.
    Collective: every rank of the expert-parallel groups runs it to the end."""
    layers = autoep_layers(model)
    if zero3:
        import deepspeed

        def gathered(p: torch.Tensor) -> Any:
            return deepspeed.zero.GatheredParameters([p])

        items: Iterator[tuple[str, torch.Tensor]] = iter(model.named_parameters())
    else:

        def gathered(p: torch.Tensor) -> Any:
            return nullcontext()

        items = iter(model.state_dict().items())
    experts: dict[str, dict[str, torch.Tensor]] = {}
    for name, param in items:
        path, layer, rest = _split(name, layers)
        with gathered(param):
            tensor = param.data.detach().clone() if zero3 else param.detach()
        if layer is None:
            yield name, tensor
            continue
        head, _, tail = rest.partition(".")
        if head == "router":  # router.gate.weight -> gate.weight (the HF router)
            yield f"{path}.gate.{tail.removeprefix('gate.')}", tensor
        elif head == "experts" and tail in EXPERTS:
            got = experts.setdefault(path, {})
            got[tail] = _gather_experts(layer, tensor)
            if len(got) == len(EXPERTS):
                yield f"{path}.experts.gate_up_proj", torch.cat((got["w1"], got["w3"]), dim=1)
                yield f"{path}.experts.down_proj", got["w2"]
                del experts[path]
        elif head in SHARED:
            yield f"{path}.{SHARED[head]}.{tail}", tensor
        elif getattr(layer, head, None) is getattr(layer, "router", None):
            continue  # the router again under its alias (`gate.gate.weight`)
        elif head in ("expert_bias", "tokens_per_expert"):
            continue  # AutoEP's own load-balancing state, not the model's
        else:
            raise RuntimeError(f"AutoEP layer {path}: no HF name for {rest}")
    if experts:
        raise RuntimeError(f"AutoEP layers {sorted(experts)}: experts incomplete")
