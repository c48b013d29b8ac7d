"""A small convolutional network for image data (channels, height, width), e.g. digits 1x8x8."""

from dataclasses import dataclass, field

from torch import nn

from experiments._classification import loss, metrics  # noqa: F401  (the workload interface)

DATA = "features"  # what it trains on (data.source digits, synthetic or file)


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    channels: list[int] = field(default_factory=lambda: [32, 64])
    dropout: float = field(default=0.1, metadata={"ge": 0.0, "lt": 1.0})

    def check(self, prefix: str) -> None:
        from scalelab.config import ConfigError

        if not self.channels or min(self.channels) < 1:
            raise ConfigError(
                f"{prefix}.channels = {self.channels} is not allowed: give one or more channel counts >= 1"
            )


def build_model(cfg: Config, *, input_shape: list[int], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        from scalelab.config import ConfigError

        raise ConfigError(
            f"workload 'cnn' needs image data (channels, height, width), got input "
            f"shape {input_shape}; use data.source = 'digits' or workload 'mlp'"
        )
    layers: list[nn.Module] = []
    in_ch = input_shape[0]
    for out_ch in cfg.channels:
        layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch), nn.ReLU()]
        in_ch = out_ch
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(cfg.dropout), nn.Linear(in_ch, num_classes)]
    return nn.Sequential(*layers)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """Each convolution and the classifier are FSDP units (train.strategy: fsdp); batch norms stay
    with the root."""
    return [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
