"""The step loop: one optimizer step for single, DataParallel, DDP and FSDP runs alike.

`build_loop` wraps the workload's model for its strategy and builds the optimizer and scaler;
`Loop.step` is the training step that both `scalelab train` and the speedup study's cells time.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from scalelab.training import strategy, workloads

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True, kw_only=True)
class Optim:
    """The optimizer of a loop: adamw or sgd with its hyper-parameters."""

    name: str = "sgd"
    lr: float = 1e-3
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0

    def build(self, params) -> torch.optim.Optimizer:
        if self.name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


@dataclass(kw_only=True)
class Loop:
    """Everything the step function touches (assigned once; no work in construction)."""

    model: torch.nn.Module
    workload: workloads.Workload
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: str
    device: torch.device

    def autocast(self):
        if self.precision == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.precision])

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over `grad_accum_steps` micro-batches; returns the summed loss.

        Gradients are all-reduced on the last micro-batch only (no_sync on the others).
        """
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(micro_batches):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with strategy.no_sync(self.model, sync=i == len(micro_batches) - 1):
                with self.autocast():
                    loss = self.workload.loss(self.model(x), y) / len(micro_batches)
                self.scaler.scale(loss).backward()
            total += loss.detach()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return total


def build_loop(
    wl: workloads.Workload,
    device: torch.device,
    *,
    strategy_name: str,
    precision: str,
    optim: Optim,
    compile: bool = False,
) -> Loop:
    """Wraps the workload's model for `strategy_name` and builds optimizer and scaler.

    `compile` runs the wrapped model through torch.compile; the first step then compiles.
    """
    model = strategy.wrap(wl.model, strategy_name, device, wl.shard_units)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = optim.build(model.parameters())
    if compile:
        model = torch.compile(model)
    return Loop(
        model=model,
        workload=wl,
        optimizer=optimizer,
        scaler=scaler,
        precision=precision,
        device=device,
    )
