"""Finds workloads by name. A workload is a module `experiments/<name>.py` that defines:

- `Config`: a frozen dataclass of its model knobs (params `train.model`);
- `build_model(cfg, *, input_shape, num_classes) -> nn.Module`: pure model code;
- `loss(logits, targets) -> Tensor` and `metrics(logits, targets) -> dict[str, Tensor]` (sums over
  the batch, so that they add up across batches and ranks).

scalelab never imports experiments statically: the name comes from params.yaml.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch

from scalelab.config import ConfigError, build

PACKAGE = "experiments"


def available() -> list[str]:
    """Names of the workload modules in experiments/."""
    package = importlib.import_module(PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def _module(name: str, key: str) -> ModuleType:
    if name not in available():
        raise ConfigError(f"{key}.workload = {name!r} is not a known workload; "
                          f"allowed: {', '.join(available())} (modules in experiments/)")
    return importlib.import_module(f"{PACKAGE}.{name}")


def check_config(name: str, model: dict[str, Any], key: str) -> Any:
    """Validates a model section against the workload's Config; returns the typed Config."""
    return build(_module(name, key).Config, model, f"{key}.model")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    config: Any
    model: torch.nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    metrics: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


def load(name: str, model: dict[str, Any], *, input_shape: list[int], num_classes: int,
         key: str = "train") -> Workload:
    """Builds the workload's model on the CPU with the current torch RNG state."""
    module = _module(name, key)
    cfg = build(module.Config, model, f"{key}.model")
    net = module.build_model(cfg, input_shape=list(input_shape), num_classes=num_classes)
    return Workload(name, cfg, net, module.loss, module.metrics)
