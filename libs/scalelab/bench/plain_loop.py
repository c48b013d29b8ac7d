"""A hand-written PyTorch training loop: the reference arm of the parity benchmark.

It imports nothing from scalelab (a test checks), so that the benchmark compares the engine's
step (scalelab.training.loop.Loop.step) with what a user would write by hand: the same MLP, SGD
with momentum, cross-entropy, gradient clipping, a warm-up + cosine schedule, and DDP or FSDP2
when a process group is up.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def build_model(num_features: int, hidden: list[int], num_classes: int, dropout: float) -> nn.Module:
    """Flatten, then Linear-ReLU-Dropout per hidden width, then the output layer."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = num_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def lr_factor(k: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `min_ratio` at step `total` - 1."""
    if k < warmup:
        return (k + 1) / warmup
    progress = min((k - warmup) / max(total - warmup - 1, 1), 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class PlainLoop:
    """Model (wrapped in DDP, or sharded with FSDP2 layer by layer, when torch.distributed is
    initialized), SGD, gradient clipping and a warm-up + cosine LR schedule, as written by hand."""

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        momentum: float,
        *,
        fsdp: bool = False,
        clip: float = 0.0,
        schedule: tuple[int, int, float] | None = None,
    ) -> None:
        if fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            model = nn.parallel.DistributedDataParallel(model)
        self.model, self.clip = model, clip
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        self.scheduler = None
        if schedule is not None:  # (total steps, warm-up steps, min ratio)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: lr_factor(k, *schedule))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on one batch; returns the loss (detached)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        if self.clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return loss.detach()

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters and buffers (DDP wrapper removed; under FSDP its shards)."""
        model = self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel) else self.model
        return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in model.state_dict().items()}
