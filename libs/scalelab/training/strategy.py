"""The one function that turns a plain model into its parallel form, and its inverse for state.

fsdp is FSDP2 (`torch.distributed.fsdp.fully_shard`): each module the workload names in
`shard_units(model)` becomes one sharded unit, then the root. Parameters, gradients and optimizer
state live as shards (DTensors) on each rank; `full_state` gathers them into the plain model's
state dict for a checkpoint, and `load_full_state` shards such a dict again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn


def wrap(
    model: nn.Module,
    strategy: str,
    device: torch.device,
    shard_units: Callable[[nn.Module], list[nn.Module]] | None = None,
) -> nn.Module:
    """Moves `model` to `device` and wraps it for `strategy` ('single', 'dp', 'ddp' or 'fsdp')."""
    model = model.to(device)
    if strategy == "dp":
        return nn.DataParallel(model)
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        for unit in shard_units(model) if shard_units else []:
            fully_shard(unit, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DataParallel or DDP wrapper (an FSDP2 model is its own module)."""
    return model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def model_state(model: nn.Module) -> dict[str, Any]:
    """The plain model's whole state dict on every rank (gathered under fsdp: a collective)."""
    if not is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plain model's state dict and the optimizer's, whole. A collective under fsdp: every
    rank calls it, and rank 0 gets the gathered tensors on the CPU (the others get empty dicts)."""
    if not is_sharded(model):
        return unwrap(model).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any], optim_state: dict[str, Any]
) -> None:
    """Loads what `full_state` returned (read by every rank); under fsdp each rank keeps its shard."""
    if not is_sharded(model):
        unwrap(model).load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=optim_state,
        options=StateDictOptions(full_state_dict=True),
    )


def local_bytes(tensors) -> int:
    """Bytes this rank holds of `tensors` (its shard of a DTensor, all of a plain tensor)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def no_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """On micro-steps that do not reduce gradients: DDP's no_sync(), or FSDP2's
    set_requires_gradient_sync(False) (gradients accumulate unsharded until the last micro-step).
    A no-op otherwise."""
    if sync:
        return contextlib.nullcontext()
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    if is_sharded(model):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
