"""The step loop: one optimizer step for every strategy alike (its object does what differs).

`build_loop` wraps the workload's model for its strategy and builds the optimizer and scaler;
`Loop.step` is the training step that both `scalelab train` and the speedup study's cells time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from scalelab.config import names
from scalelab.training import strategy, workloads

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True, kw_only=True)
class Optim:
    """The optimizer of a loop: a name of `OPTIMIZERS` with its hyper-parameters. Any other name
    is refused here (ConfigError), never built as another optimizer."""

    name: str = "sgd"
    lr: float = 1e-3
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        names.check("optimizer", self.name, names.OPTIMIZERS)

    def build(self, params) -> torch.optim.Optimizer:
        return OPTIMIZERS[self.name](self, params)


# how each optimizer of config/names.py (the registry) is built: the same keys (a test checks it)
OPTIMIZERS: dict[str, Callable[[Optim, Any], torch.optim.Optimizer]] = {
    "adamw": lambda o, params: torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay),
    "sgd": lambda o, params: torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay),
}


@dataclass(kw_only=True)
class Loop:
    """Everything the step function touches (assigned once; no work in construction)."""

    model: torch.nn.Module
    strategy: strategy.Strategy  # what wrapped `model`: its no_sync, gradient norm and state
    workload: workloads.Workload
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: str
    device: torch.device
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None  # stepped once per optimizer step
    clip_norm: float = 0.0  # the global gradient norm is clipped to this; 0: off
    # the last step's lr and, when clipped or asked for, its gradient norm before clipping
    last: dict[str, Any] = field(default_factory=dict)

    def stateful(self) -> dict[str, Any]:
        """Every part of the loop that has a `state_dict()`, besides the model and the optimizer
        (the strategy saves those), and the strategy's own parts (a communication hook's state):
        found, not listed, so a new part cannot be left out of the checkpoint."""
        parts = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("model", "optimizer")}
        found = {name: part for name, part in parts.items() if hasattr(part, "state_dict")}
        return {**found, **self.strategy.stateful(self.model)}

    def autocast(self):
        if self.precision == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.precision])

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], measure_norm: bool = False) -> torch.Tensor:
        """One optimizer step over `grad_accum_steps` micro-batches; returns the summed loss.

        Gradients are all-reduced on the last micro-batch only (no_sync on the others). With
        clipping on (or `measure_norm`), the global gradient norm is computed after unscaling
        (fp16) and kept in `last['grad_norm']`.
        """
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(micro_batches):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.strategy.no_sync(self.model, sync=i == len(micro_batches) - 1):
                with self.autocast():
                    loss = self.workload.loss(self.model(x), y) / len(micro_batches)
                self.scaler.scale(loss).backward()
            total += loss.detach()
        self.last = {"lr": self.optimizer.param_groups[0]["lr"]}
        if self.clip_norm > 0 or measure_norm:
            self.scaler.unscale_(self.optimizer)  # a no-op unless fp16: clip the true gradients
            self.last["grad_norm"] = norm = self.strategy.grad_norm(self.model.parameters())
            if self.clip_norm > 0:
                self.strategy.clip_grads(self.model.parameters(), self.clip_norm, norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        return total


def build_loop(
    wl: workloads.Workload,
    device: torch.device,
    *,
    strategy_name: str,
    precision: str,
    optim: Optim,
    compile: bool = False,
    schedule: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler] | None = None,
    clip_norm: float = 0.0,
    activation_checkpointing: bool = False,
    init_state: dict[str, torch.Tensor] | None = None,
    num_devices: int = 1,
) -> Loop:
    """Wraps the workload's model for `strategy_name` and builds optimizer, scheduler and scaler.

    `compile` runs the wrapped model through torch.compile; the first step then compiles.
    `schedule` builds the LR scheduler from the optimizer (training.schedule.build). A model on
    the meta device (fsdp) is materialised from `init_state` (see `strategy.Strategy.wrap`).
    `num_devices`: the devices per node the job asks for (dp drives them all from one process).
    """
    chosen = strategy.get(strategy_name)
    model = chosen.wrap(
        wl.model,
        device,
        wl.shard_units,
        activation_checkpointing,
        init_state,
        num_devices=num_devices,
        precision=precision,
    )
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = optim.build(model.parameters())
    if compile:
        model = torch.compile(model)
    return Loop(
        model=model,
        strategy=chosen,
        workload=wl,
        optimizer=optimizer,
        scaler=scaler,
        precision=precision,
        device=device,
        scheduler=schedule(optimizer) if schedule else None,
        clip_norm=clip_norm,
    )
