"""A multilayer perceptron on flat features (digits, synthetic or tabular data)."""

import math
from dataclasses import dataclass, field

from torch import nn

from experiments._classification import loss, metrics  # noqa: F401  (the workload interface)

DATA = "features"  # what it trains on (data.source digits, synthetic or file)


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    dropout: float = field(default=0.1, metadata={"ge": 0.0, "lt": 1.0})

    def check(self, prefix: str) -> None:
        from scalelab.config import ConfigError

        if not self.hidden or min(self.hidden) < 1:
            raise ConfigError(f"{prefix}.hidden = {self.hidden} is not allowed: give one or more layer widths >= 1")


def build_model(cfg: Config, *, input_shape: list[int], num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in cfg.hidden:
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(cfg.dropout)]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """Each linear layer is one FSDP unit (train.strategy: fsdp)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)]
