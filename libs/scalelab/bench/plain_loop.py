"""A hand-written PyTorch training loop: the reference arm of the parity benchmark.

It imports nothing from scalelab (a test checks), so that the benchmark compares the engine's
step (scalelab.training.loop.Loop.step) with what a user would write by hand: the same MLP, SGD
with momentum, cross-entropy, and DDP when a process group is up.
"""

from __future__ import annotations

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


class PlainLoop:
    """Model (wrapped in DDP when torch.distributed is initialized) and its SGD optimizer."""

    def __init__(self, model: nn.Module, lr: float, momentum: float) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            model = nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on one batch; returns the loss (detached)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def weights(self) -> dict[str, torch.Tensor]:
        """The plain model's parameters and buffers (DDP wrapper removed)."""
        model = self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel) else self.model
        return model.state_dict()
