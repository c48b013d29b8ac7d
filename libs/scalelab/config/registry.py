"""Workloads by name: `experiments/<name>.py`, picked by `train.workload` / `speedup.workload`.

scalelab never imports experiments statically: the name comes from params.yaml, and this module
finds the workload module and checks a model section against the workload's own `Config`.
`scalelab.training.workloads` builds the model from it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any

from scalelab.config.loader import ConfigError, build, check_name

PACKAGE = "experiments"


def available() -> list[str]:
    """Names of the workload modules in experiments/."""
    package = importlib.import_module(PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def workload_module(name: str, key: str) -> ModuleType:
    """The module of workload `name`; `key` is the params section that names it."""
    check_name(f"{key}.workload", name)
    if name not in available():
        raise ConfigError(
            f"{key}.workload = {name!r} is not a known workload; "
            f"allowed: {', '.join(available())} (modules in experiments/)"
        )
    return importlib.import_module(f"{PACKAGE}.{name}")


def check_config(name: str, model: dict[str, Any], key: str) -> Any:
    """Validates a model section against the workload's Config; returns the typed Config."""
    return build(workload_module(name, key).Config, model, f"{key}.model")


def check_dataset_workload(name: str, key: str) -> None:
    """Refuses a workload that runs on its own synthetic batches only (`SYNTHETIC_ONLY`) under `key`."""
    if getattr(workload_module(name, key), "SYNTHETIC_ONLY", False):
        trainable = [n for n in available() if not getattr(workload_module(n, key), "SYNTHETIC_ONLY", False)]
        raise ConfigError(
            f"{key}.workload = {name!r} is not allowed: it runs on its own synthetic batches only "
            f"(speedup.workload, scalelab bench mfu); {key} needs one of: {', '.join(trainable)}"
        )
