"""Loss and metrics shared by the classification workloads."""

import torch
import torch.nn.functional as F


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the batch."""
    return F.cross_entropy(logits.float(), targets)


def metrics(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over the batch, so that they add up across batches and ranks."""
    return {
        "loss_sum": F.cross_entropy(logits.float(), targets, reduction="sum"),
        "correct": (logits.argmax(dim=1) == targets).sum(),
        "count": torch.tensor(len(targets), device=targets.device),
    }
