"""Each strategy's behaviour: how it wraps a plain model, steps it, and takes its state out and in.

`get(train.strategy)` is the registered strategy of `scalelab.config.strategies` (its facts) as an
object of this module's class for it, which owns the behaviour: `build` (fsdp's on the meta
device), `wrap(model, device, ...)`, `no_sync`, `grad_norm` and `clip_grads`, `model_state` and the
checkpoint's state out and in (`full_state` / `load_full_state`, or `sharded_state` /
`load_sharded_state`), the stateful parts of its own (`stateful`: a communication hook's state) and
the devices one process drives. Callers
ask the object; nothing here or elsewhere looks at the wrapped model's type.

fsdp is FSDP2 (`torch.distributed.fsdp.fully_shard`): each module the workload names in
`shard_units(model)` becomes one sharded unit, then the root. Parameters, gradients and optimizer
state live as shards (DTensors) on each rank; `sharded_state` hands a checkpoint each rank's shards,
and `model_state` gathers the plain model's state dict for `model.pt`.

A new strategy is one class here (named in `KINDS`) and one row in config/strategies.py; ddp_powersgd
is the example, with its hook's state as a checkpoint part in a module of its own (powersgd_state.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from scalelab.config import strategies


def _called(model: nn.Module) -> nn.Module:
    """The wrapped model inside torch.compile's module, if compiled (`build_loop(compile=True)`)."""
    return getattr(model, "_orig_mod", model)


class Strategy(strategies.Strategy):
    """A registered strategy with its behaviour: single's is the plain model's (nothing to reduce)."""

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
        many from `device` on, and no more (`devices`). `precision` sets what the strategy itself
        casts (fsdp's MixedPrecisionPolicy); autocast stays the loop's.
        """
        on_meta = any(p.is_meta for p in model.parameters())
        if on_meta and not self.sharded:
            sharded = " or ".join(n for n, s in strategies.STRATEGIES.items() if s.sharded)
            raise ValueError(f"a model on the meta device needs strategy {sharded}, not {self.name!r}")
        if not on_meta and not self.sharded:  # fully_shard moves each unit itself, never the whole model
            model = model.to(device)
        if activation_checkpointing:
            from torch.distributed._composable import checkpoint

            for unit in shard_units(model) if shard_units else [model]:
                checkpoint(unit)
        opts = {"num_devices": num_devices, "precision": precision}
        return self._parallel(model, device, shard_units, on_meta, init_state, **opts)

    def build(self, make: Callable[[], Any], is_main: bool, resuming_shards: bool) -> tuple[Any, dict | None]:
        """`make()` (the workload, seeded alike on every rank) and the `init_state` for `wrap`: the
        model is built whole on each rank, so there is none (None)."""
        return make(), None

    def _parallel(self, model, device, shard_units, on_meta, init_state, *, num_devices=1, precision="fp32"):
        """The model on `device` in its parallel form."""
        return model

    def devices(self, device: torch.device, num_devices: int) -> list[torch.device]:
        """The devices one process drives when `num_devices` are asked for per node: its own."""
        return [device]

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain model inside the wrapper (and inside torch.compile's module)."""
        return _called(model)

    def no_sync(self, model: nn.Module, sync: bool) -> AbstractContextManager:
        """Around a micro-step's forward and backward: with `sync` False, gradients accumulate
        without being reduced across ranks (reduced on the last micro-step, `sync` True)."""
        return contextlib.nullcontext()

    def grad_norm(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor:
        """The L2 norm of all gradients together, as one process would compute it: the
        gradients are already reduced (every rank computes the same value)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())

    def clip_grads(self, parameters: Iterable[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
        """Scales the gradients so that their global norm (`grad_norm`'s) is at most `max_norm`."""
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        """The plain model's whole state dict under its own names, for `model.pt` (every rank's copy)."""
        return self.unwrap(model).state_dict()

    def full_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The checkpoint's model and optimizer state, whole (a strategy that is not sharded)."""
        return {"model": self.model_state(model), "optimizer": optimizer.state_dict()}

    def load_full_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Sets `full_state`'s model and optimizer state back."""
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        raise TypeError(f"strategy {self.name!r} is not sharded: its state is whole (full_state)")

    def load_sharded_state(self, model, optimizer, read: Callable[[dict[str, Any]], None]) -> None:
        raise TypeError(f"strategy {self.name!r} is not sharded: it loads whole states (load_full_state)")

    def stateful(self, model: nn.Module) -> dict[str, Any]:
        """The strategy's own parts of the wrapped model with `state_dict()`, for the checkpoint
        beside the loop's (`Loop.stateful`): none, unless a hook keeps state between steps."""
        return {}


class DataParallel(Strategy):
    def _parallel(self, model, device, shard_units, on_meta, init_state, *, num_devices=1, precision="fp32"):
        if device.type != "cuda":  # nothing to replicate onto: the plain model (config refuses device cpu)
            return model
        return _AutocastDataParallel(model, device_ids=[d.index for d in self.devices(device, num_devices)])

    def devices(self, device: torch.device, num_devices: int) -> list[torch.device]:
        """The GPUs from `device` on, `gpus_per_process` of them (on a CPU: the one device)."""
        if device.type != "cuda":
            return [device]
        first = device.index or 0
        return [torch.device("cuda", i) for i in range(first, first + self.gpus_per_process(num_devices))]

    def unwrap(self, model: nn.Module) -> nn.Module:
        return getattr(_called(model), "module", _called(model))  # on a CPU dp wraps nothing


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
    """DistributedDataParallel: gradients all-reduced in buckets during backward."""

    def _parallel(self, model, device, shard_units, on_meta, init_state, **_):
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return _called(model).module

    def no_sync(self, model: nn.Module, sync: bool) -> AbstractContextManager:
        return contextlib.nullcontext() if sync else _called(model).no_sync()


class FSDP(Strategy):
    """FSDP2: parameters, gradients and optimizer state as shards; gradients reduce-scattered."""

    def build(self, make: Callable[[], Any], is_main: bool, resuming_shards: bool) -> tuple[Any, dict | None]:
        """The workload on the meta device (no memory), sharded before it is materialised by `wrap`:
        the initial weights are made once, on rank 0's CPU ({} on the other ranks), or not at all
        when sharded checkpoints will fill the shards (None)."""
        with torch.device("meta"):
            workload = make()
        if resuming_shards:
            return workload, None
        return workload, make().model.state_dict() if is_main else {}

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

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module, sync: bool):
        """set_requires_gradient_sync(False): gradients accumulate unsharded until the last micro-step."""
        if sync:
            yield
            return
        model = _called(model)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def grad_norm(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor:
        """Each rank holds shards (DTensors): the partial norms are reduced across ranks (a collective)."""
        norm = super().grad_norm(parameters)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a plain zero: no gradient yet

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        """A collective: gathered to rank 0's CPU memory alone; the other ranks get an empty dict."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(_called(model), options=options)

    def full_state(self, model, optimizer):
        raise TypeError(f"strategy {self.name!r} is sharded: its checkpoint state is this rank's shards")

    def load_full_state(self, model, optimizer, state):
        raise TypeError(f"strategy {self.name!r} is sharded: it loads its shards (load_sharded_state)")

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This rank's shards of the model's and optimizer's state (DTensors keyed by the plain
        model's names), for `torch.distributed.checkpoint`: nothing is gathered."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(_called(model), optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def load_sharded_state(self, model, optimizer, read: Callable[[dict[str, Any]], None]) -> None:
        """Fills this rank's shards by `read` (a DCP load into `sharded_state`'s dicts, in place) and
        sets them into the model and the optimizer."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        target = self.sharded_state(model, optimizer)
        read(target)
        set_state_dict(
            _called(model), optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"]
        )


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


class DDPPowerSGD(DDP):
    """DDP whose bucket all-reduce is PowerSGD's (torch's `powerSGD_hook`): each gradient matrix
    goes over the wire as rank-`RANK` factors P and Q, with error feedback (what a step's
    compression lost is added to the next step's gradient, on each rank) and warm start (Q reused
    from step to step). The first `START_ITER` reducing steps all-reduce uncompressed (torch asks
    > 1: DDP rebuilds its buckets after the first; its own default, 1000, suits long runs only).
    Works on gloo (CPU) and NCCL.

    The hook's state is a stateful part (`stateful`: `comm_hook`) that every checkpoint saves: its
    step count, P and Q, its RNG and every rank's error feedback (gathered: a collective), so a
    resumed run compresses as the uninterrupted one would (bitwise: tests/training/test_strategy_registry.py).
    A resume at another world size keeps all but the errors, which start at zero (logged).
    Not for fp16 (refused at wrap): a GradScaler step that overflows would leave its inf in the
    error feedback, and every later step would overflow too; bf16 and fp32 are fine.
    """

    RANK = 1  # matrix_approximation_rank
    START_ITER = 2  # reducing steps (optimizer steps) all-reduced uncompressed before compressing

    def _parallel(self, model, device, shard_units, on_meta, init_state, **opts):
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        from scalelab.training.powersgd_state import PowerSGDPart, hook

        if opts.get("precision") == "fp16":
            raise ValueError(
                f"strategy {self.name!r} does not take precision fp16: an overflowing step's inf would stay in "
                "PowerSGD's error feedback; use bf16 or fp32"
            )
        ddp = super()._parallel(model, device, shard_units, on_meta, init_state, **opts)
        state = PowerSGDState(None, matrix_approximation_rank=self.RANK, start_powerSGD_iter=self.START_ITER)
        ddp._powersgd = PowerSGDPart(state, ddp.module, device)  # the strategy's part of this model
        ddp.register_comm_hook(ddp._powersgd, hook)
        return ddp

    def stateful(self, model: nn.Module) -> dict[str, Any]:
        return {"comm_hook": _called(model)._powersgd}


# config's registry (what the config, the shape check and the study know), each with its behaviour
KINDS: dict[str, type[Strategy]] = {
    "single": Strategy,
    "dp": DataParallel,
    "ddp": DDP,
    "fsdp": FSDP,
    "ddp_powersgd": DDPPowerSGD,
}
STRATEGIES: dict[str, Strategy] = {name: KINDS[name](**asdict(facts)) for name, facts in strategies.STRATEGIES.items()}


def get(name: str) -> Strategy:
    """The registered strategy `name` with its behaviour; a ConfigError names the allowed ones."""
    return STRATEGIES[strategies.get(name).name]


def local_bytes(tensors) -> int:
    """Bytes this rank holds of `tensors` (its shard of a DTensor, all of a plain tensor)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total
