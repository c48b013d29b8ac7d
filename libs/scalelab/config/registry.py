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


def consumes(name: str, key: str) -> str:
    """What workload `name` trains on: its module's `DATA`, 'features' (the default) or 'tokens'."""
    return getattr(workload_module(name, key), "DATA", "features")


def check_data(name: str, model: Any, source: str, kind: str, vocab_size: int | None) -> None:
    """Refuses a workload whose data kind is not what `data.source` gives, and a token model whose
    vocabulary is smaller than the tokenizer's."""
    wants = consumes(name, "train")
    if wants != kind:
        fits = [n for n in available() if consumes(n, "train") == kind]
        raise ConfigError(
            f"train.workload = {name!r} consumes {wants}, but data.source = {source!r} gives {kind}; "
            f"with this source use one of: {', '.join(fits) or 'none'}"
        )
    if vocab_size is not None and getattr(model, "vocab_size", vocab_size) < vocab_size:
        raise ConfigError(
            f"train.model.vocab_size = {model.vocab_size} is not allowed with data.source = {source!r}: "
            f"its tokenizer has {vocab_size} tokens; set it to {vocab_size} or more"
        )
