"""Each strategy's `wrap`, which turns a plain model into its parallel form, and its inverse for state.

`get(train.strategy)` is the registered strategy of `scalelab.config.strategies` extended with
`wrap(model, device, ...)`. fsdp is FSDP2 (`torch.distributed.fsdp.fully_shard`): each module the
workload names in `shard_units(model)` becomes one sharded unit, then the root. Parameters,
gradients and optimizer state live as shards (DTensors) on each rank; `sharded_state` hands a
checkpoint each rank's shards, and `model_state` gathers the plain model's state dict for `model.pt`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from scalelab.config import strategies


class Strategy(strategies.Strategy):
    """A registered strategy with how it wraps a model: as it is (single), or in its `_parallel` form."""

    def wrap(
        self,
        model: nn.Module,
        device: torch.device,
        shard_units: Callable[[nn.Module], list[nn.Module]] | None = None,
        activation_checkpointing: bool = False,
        init_state: dict[str, Any] | None = None,
        *,
        num_devices: int = 1,
        precision: str = "fp32",
    ) -> nn.Module:
        """Moves `model` to `device` and wraps it for this strategy.

        `activation_checkpointing` makes each of the workload's `shard_units` (the whole model
        without them) recompute its activations in backward instead of keeping them; the RNG state
        is replayed, so dropout draws the same masks.

        A model on the meta device (sharded strategies only) is sharded first, then each rank
        allocates only its shards on `device` and fills them from `init_state`: the whole initial
        state dict on global rank 0 (an empty dict on the others), broadcast tensor by tensor. With
        `init_state` None on every rank the shards are left for a sharded checkpoint to fill.

        `num_devices` is the devices per node the job asks for (`nproc_per_node`): dp drives that
        many from `device` on, and no more. `precision` sets what the strategy itself casts
        (fsdp's MixedPrecisionPolicy); autocast stays the loop's.
        """
        on_meta = any(p.is_meta for p in model.parameters())
        if on_meta and not self.sharded:
            raise ValueError(f"a model on the meta device needs strategy fsdp, not {self.name!r}")
        if not on_meta and not self.sharded:  # fully_shard moves each unit itself, never the whole model
            model = model.to(device)
        if activation_checkpointing:
            from torch.distributed._composable import checkpoint

            for unit in shard_units(model) if shard_units else [model]:
                checkpoint(unit)
        opts = {"num_devices": num_devices, "precision": precision}
        return self._parallel(model, device, shard_units, on_meta, init_state, **opts)

    def _parallel(
        self,
        model: nn.Module,
        device: torch.device,
        shard_units: Callable[[nn.Module], list[nn.Module]] | None,
        on_meta: bool,
        init_state: dict[str, Any] | None,
        *,
        num_devices: int = 1,
        precision: str = "fp32",
    ) -> nn.Module:
        """The model on `device` in its parallel form."""
        return model


class DataParallel(Strategy):
    def _parallel(self, model, device, shard_units, on_meta, init_state, *, num_devices=1, precision="fp32"):
        if device.type != "cuda":  # nothing to replicate onto: the plain model (config refuses device cpu)
            return model
        first = device.index or 0
        return _AutocastDataParallel(model, device_ids=list(range(first, first + num_devices)))


class _AutocastDataParallel(nn.DataParallel):
    """nn.DataParallel whose replica threads run under the caller's autocast dtype.

    autocast's dtype is per thread: torch's parallel_apply re-enters autocast in each replica
    thread with `enabled` only, so a bf16 caller's replicas would compute in fp16.
    """

    def parallel_apply(self, replicas, inputs, kwargs):
        kind = self.src_device_obj.type
        if torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
            replicas = [_UnderAutocast(r, kind, dtype) for r in replicas]
        return super().parallel_apply(replicas, inputs, kwargs)


class _UnderAutocast:
    """Calls `module` inside autocast(`kind`, `dtype`), in whichever thread calls it."""

    def __init__(self, module: nn.Module, kind: str, dtype: torch.dtype) -> None:
        self.module, self.kind, self.dtype = module, kind, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.kind, dtype=self.dtype):
            return self.module(*args, **kwargs)


class DDP(Strategy):
    def _parallel(self, model, device, shard_units, on_meta, init_state, **_):
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)


class FSDP(Strategy):
    def _parallel(self, model, device, shard_units, on_meta, init_state, *, num_devices=1, precision="fp32"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        policy = mixed_precision(precision)
        for unit in shard_units(model) if shard_units else []:
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        model = fully_shard(model, mesh=mesh, mp_policy=policy)
        if on_meta:
            _materialise(model, device, init_state)
        return model


def mixed_precision(precision: str) -> Any:
    """FSDP2's policy for `precision`: under bf16 the parameters are all-gathered and computed in
    bf16 and gradients reduce-scattered in fp32 (torchtitan's default); fp16 (GradScaler) and fp32
    keep fp32 parameters (autocast alone casts the compute)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _materialise(model: nn.Module, device: torch.device, init_state: dict[str, Any] | None) -> None:
    """Allocates this rank's shards on `device` and fills them from rank 0's `init_state`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    if init_state is not None:  # a collective: rank 0 sends each tensor, every rank keeps its shard
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, init_state, options=options)


# config's registry (what the config, the shape check and the study know), each with its wrap
STRATEGIES: dict[str, Strategy] = {
    name: kind(**asdict(strategies.get(name)))
    for name, kind in (("single", Strategy), ("dp", DataParallel), ("ddp", DDP), ("fsdp", FSDP))
}


def get(name: str) -> Strategy:
    """The registered strategy `name` with its `wrap`; a ConfigError names the allowed ones."""
    return STRATEGIES[strategies.get(name).name]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DataParallel or DDP wrapper (an FSDP2 model is its own module)."""
    return model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def model_state(model: nn.Module) -> dict[str, Any]:
    """The plain model's whole state dict, for `model.pt`: every rank's own copy, or under fsdp
    (a collective) gathered to rank 0's CPU memory alone; the other ranks get an empty dict."""
    if not is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of an fsdp model's and optimizer's state (DTensors keyed by the plain
    model's names), for `torch.distributed.checkpoint`: nothing is gathered."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def load_sharded_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, read: Callable[[dict[str, Any]], None]
) -> None:
    """Fills this rank's shards by `read` (a DCP load into `sharded_state`'s dicts, in place) and
    sets them into the model and the optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    target = sharded_state(model, optimizer)
    read(target)
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"])


def local_bytes(tensors) -> int:
    """Bytes this rank holds of `tensors` (its shard of a DTensor, all of a plain tensor)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def grad_norm(parameters) -> torch.Tensor:
    """The L2 norm of all gradients together, as one process would compute it: under fsdp each
    rank holds shards (DTensors) and the partial norms are reduced across ranks (a collective);
    under ddp the gradients are already all-reduced, so every rank computes the same value."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


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
