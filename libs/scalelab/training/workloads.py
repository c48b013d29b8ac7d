"""Builds workloads by name. A workload is a module `experiments/<name>.py` that defines:

- `Config`: a frozen dataclass of its model knobs (params `train.model`);
- `build_model(cfg, *, input_shape, num_classes) -> nn.Module`: pure model code;
- `loss(logits, targets) -> Tensor` and `metrics(logits, targets) -> dict[str, Tensor]` (sums over
  the batch, so that they add up across batches and ranks);
- optionally `shard_units(model) -> list[nn.Module]`: the submodules that `train.strategy: fsdp`
  shards one by one (each is gathered only while it computes). Without it, fsdp shards the model
  as one unit. The workload needs no FSDP import: it names its blocks, scalelab shards them;
- `DATA`: what it trains on, 'features' (rows with a class label: data.source digits, synthetic,
  file; the default) or 'tokens' (a token stream: data.source text; its Config then has `seq_len`,
  the tokens of a sample, and `vocab_size`). Params validation refuses a workload whose `DATA` is
  not what the source gives. `metrics` may return `count` (the predictions summed, e.g. tokens);
  without it, the batch's rows are counted;
- optionally `synthetic_batch(cfg, batch_size, *, device, generator) -> (inputs, targets)`: its own
  synthetic data (token ids for experiments/gpt.py), which the speedup study and `scalelab bench mfu`
  use instead of random feature vectors.

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
from scalelab.config.registry import check_config, consumes, workload_module


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
    data: str = "features"  # what it trains on: 'features' or 'tokens'
    seq_len: int | None = None  # tokens per sample (token workloads)


def load(name: str, model: dict[str, Any], *, input_shape: list[int], num_classes: int, key: str = "train") -> Workload:
    """Builds the workload's model on the CPU with the current torch RNG state."""
    module = workload_module(name, key)
    cfg = build(module.Config, model, f"{key}.model")
    net = module.build_model(cfg, input_shape=list(input_shape), num_classes=num_classes)
    synthetic = getattr(module, "synthetic_batch", None)
    data = getattr(module, "DATA", "features")
    return Workload(
        name,
        cfg,
        net,
        module.loss,
        module.metrics,
        getattr(module, "shard_units", None),
        functools.partial(synthetic, cfg) if synthetic else None,
        data,
        cfg.seq_len if data == "tokens" else None,
    )


def seq_len(name: str, model: dict[str, Any], key: str = "train") -> int | None:
    """Tokens per sample of a token workload (its Config's `seq_len`), None for a features one;
    without building the model."""
    return check_config(name, model, key).seq_len if consumes(name, key) == "tokens" else None
