"""Builds workloads by name. A workload is a module `experiments/<name>.py` that defines:

- `Config`: a frozen dataclass of its model knobs (params `train.model`);
- `build_model(cfg, *, input_shape, num_classes) -> nn.Module`: pure model code;
- `loss(logits, targets) -> Tensor` and `metrics(logits, targets) -> dict[str, Tensor]` (sums over
  the batch, so that they add up across batches and ranks);
- optionally `shard_units(model) -> list[nn.Module]`: the submodules that `train.strategy: fsdp`
  shards one by one (each is gathered only while it computes). Without it, fsdp shards the model
  as one unit. The workload needs no FSDP import: it names its blocks, scalelab shards them;
- optionally `synthetic_batch(cfg, batch_size, *, device, generator) -> (inputs, targets)`: its own
  synthetic data (token ids for experiments/gpt.py), which the speedup study and `scalelab bench mfu`
  use instead of random feature vectors. A workload with `SYNTHETIC_ONLY = True` runs on these alone
  and is refused as `train.workload`.

scalelab never imports experiments statically: the name comes from params.yaml, and
`scalelab.config.registry` finds the module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from scalelab.config import build
from scalelab.config.registry import workload_module


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    config: Any
    model: torch.nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    metrics: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
    shard_units: Callable[[torch.nn.Module], list[torch.nn.Module]] | None = None
    # (batch_size, *, device, generator) -> (inputs, targets), the Config already bound
    synthetic_batch: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None


def load(name: str, model: dict[str, Any], *, input_shape: list[int], num_classes: int, key: str = "train") -> Workload:
    """Builds the workload's model on the CPU with the current torch RNG state."""
    module = workload_module(name, key)
    cfg = build(module.Config, model, f"{key}.model")
    net = module.build_model(cfg, input_shape=list(input_shape), num_classes=num_classes)
    synthetic = getattr(module, "synthetic_batch", None)
    return Workload(
        name,
        cfg,
        net,
        module.loss,
        module.metrics,
        getattr(module, "shard_units", None),
        functools.partial(synthetic, cfg) if synthetic else None,
    )
