"""Configuration: the strict loader (`loader`), the params.yaml schema (`schema`), the workload
registry (`registry`), the strategies (`strategies`), the optimizer and LR schedule names
(`names`) and `-S key=value` overrides (`overrides`).

Owns: turning YAML and command-line strings into frozen, validated dataclasses, with errors that
name the key, the bad value and what is allowed. Imports nothing from scalelab outside this
package, and never probes the machine.
"""

from scalelab.config.loader import ConfigError, build, flatten, knob, read_yaml, to_dict
from scalelab.config.schema import (
    FROZEN,
    DataConfig,
    Params,
    SpeedupConfig,
    TrainConfig,
    load_params,
    parse_params,
)

__all__ = [
    "FROZEN",
    "ConfigError",
    "DataConfig",
    "Params",
    "SpeedupConfig",
    "TrainConfig",
    "build",
    "flatten",
    "knob",
    "load_params",
    "parse_params",
    "read_yaml",
    "to_dict",
]
