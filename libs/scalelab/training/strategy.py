"""The one function that turns a plain model into its parallel form."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn


def wrap(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """Moves `model` to `device` and wraps it for `strategy` ('single', 'dp' or 'ddp')."""
    model = model.to(device)
    if strategy == "dp":
        return nn.DataParallel(model)
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DataParallel or DDP wrapper."""
    return model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model


def no_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """DDP's no_sync() on micro-steps that do not all-reduce; a no-op otherwise."""
    if not sync and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()
