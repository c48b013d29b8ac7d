"""A hand-written PyTorch training loop, the parity benchmark's reference arm: it imports nothing from
scalelab (a test checks), so the engine's Loop.step is compared with what a user writes by hand: the
same MLP, SGD with momentum, cross-entropy, gradient clipping, a warm-up + cosine schedule, and DDP
or FSDP2 as the caller (who asks its strategy) says."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def build_model(num_features: int, hidden: list[int], num_classes: int, dropout: float) -> nn.Module:
    """Flatten, then Linear-ReLU-Dropout per hidden width, then the output layer."""
    widths, layers = [num_features, *hidden], [nn.Flatten()]
    for width, h in zip(widths, hidden):
        layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers, nn.Linear(widths[-1], num_classes))


def lr_factor(k: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to `min_ratio` at step `total_steps` - 1."""
    if k < warmup_steps:
        return (k + 1) / warmup_steps
    progress = min((k - warmup_steps) / max(total_steps - warmup_steps - 1, 1), 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def local_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s parameters and buffers on this rank (of a DTensor, this rank's shard)."""
    return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in model.state_dict().items()}


class PlainLoop:
    """Model (`ddp`: called through DistributedDataParallel; `fsdp`: sharded with FSDP2 layer by
    layer), SGD (`optim`: lr and momentum), gradient clipping at norm `clip` and a warm-up + cosine LR
    schedule (`schedule`: lr_factor's keywords), as written by hand."""

    def __init__(self, model: nn.Module, optim: dict, clip: float, schedule: dict, *, ddp=False, fsdp=False):
        if fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(model)  # in place: `model` holds the shards
        self.model, self.clip = model, clip  # the plain model, whose weights are compared
        self.forward = nn.parallel.DistributedDataParallel(model) if ddp else model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=optim["lr"], momentum=optim["momentum"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: lr_factor(k, **schedule))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on one batch; returns the loss (detached)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.forward(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach()

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters and buffers (under FSDP its shards)."""
        return local_state(self.model)
