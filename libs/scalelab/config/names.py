"""The registries: every optimizer, LR schedule, data source, sweep sampler and search pruner
params.yaml or the CLI may name, one small frozen object each, and the only list of them.

The schema's allowed values (`train.optimizer`, `train.lr_schedule`, `data.source`) and `scalelab
sweep submit --method` and `--pruner` are these tables' keys; any other name is refused with the
key, the value and the allowed names (`check`), never built as a fallback. What lies above this package builds each
entry from a table keyed the same (a test checks it): `training.loop.OPTIMIZERS`,
`data.prepare.TOKEN_READERS` (token sources) and `data.features.FEATURE_READERS`,
`sweeps.samplers.SAMPLERS` and `training.pruning.PRUNERS`. An LR schedule is pure arithmetic, so
its entry holds its own curve.

To add one: its entry here, and its builder in the table above (a schedule needs no builder; a data
source also needs its section of knobs in config/schema.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from scalelab.config.loader import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class Optimizer:
    name: str  # the value of train.optimizer
    doc: str  # what training builds, with the knobs it reads


@dataclass(frozen=True, kw_only=True, slots=True)
class LrSchedule:
    name: str  # the value of train.lr_schedule
    doc: str
    # after the warm-up: None (constant lr), or the factor falling from 1 to 0 over progress 0..1 (the
    # steps after the warm-up), given train.lr_decay_fraction; lr = lr * (min_ratio + (1 - min_ratio) * it)
    decay: Callable[[float, float], float] | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DataSource:
    name: str  # the value of data.source
    kind: str  # what it gives a workload: 'features' (rows with class labels) or 'tokens'
    doc: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Sampler:
    name: str  # the value of `scalelab sweep submit --method`
    doc: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Pruner:
    name: str  # the value of `scalelab sweep submit --pruner`
    doc: str


def _table(*entries):
    return {e.name: e for e in entries}


OPTIMIZERS: dict[str, Optimizer] = _table(
    Optimizer(name="adamw", doc="torch.optim.AdamW(lr, weight_decay)"),
    Optimizer(name="sgd", doc="torch.optim.SGD(lr, momentum, weight_decay)"),
)


def _wsd(progress: float, decay_fraction: float) -> float:
    """Stable at 1 until the last `decay_fraction` of the steps after warm-up, then linear to 0."""
    return min(1.0, (1.0 - progress) / decay_fraction)


LR_SCHEDULES: dict[str, LrSchedule] = _table(
    LrSchedule(name="constant", doc="the lr after the warm-up", decay=None),
    LrSchedule(
        name="cosine",
        doc="a cosine decay to lr * min_lr_ratio at the last step",
        decay=lambda progress, _: 0.5 * (1.0 + math.cos(math.pi * progress)),
    ),
    LrSchedule(
        name="linear",
        doc="a linear decay to lr * min_lr_ratio at the last step",
        decay=lambda progress, _: 1 - progress,
    ),
    LrSchedule(
        name="wsd",
        doc="warm-up, stable at lr, then a linear decay to lr * min_lr_ratio over the last lr_decay_fraction of "
        "the steps after the warm-up",
        decay=_wsd,
    ),
)

DATA_SOURCES: dict[str, DataSource] = _table(
    DataSource(name="digits", kind="features", doc="scikit-learn's 8x8 digits (1,797 images, 10 classes)"),
    DataSource(name="synthetic", kind="features", doc="Gaussian classes, data.synthetic"),
    DataSource(name="file", kind="features", doc="a CSV or Parquet table, data.file"),
    DataSource(name="text", kind="tokens", doc="UTF-8 files as byte tokens, data.text"),
    DataSource(
        name="jsonl", kind="tokens", doc="JSON Lines files, one string field per line as byte tokens, data.jsonl"
    ),
)

SAMPLERS: dict[str, Sampler] = _table(
    Sampler(name="grid", doc="every combination of the listed values, once (a job array on SLURM)"),
    Sampler(name="tpe", doc="Optuna's TPE: random points first, then a model of the good ones"),
    Sampler(name="random", doc="independent random draws from the space"),
)

PRUNERS: dict[str, Pruner] = _table(
    Pruner(name="none", doc="every trial runs to its end"),
    Pruner(name="median", doc="stops a trial below the median of earlier trials at the same validation"),
    Pruner(name="hyperband", doc="Optuna's Hyperband: successive-halving brackets over the validations"),
    Pruner(name="halving", doc="Optuna's successive halving: a third of the trials go on at each rung"),
)


def allowed(table: dict[str, object]) -> str:
    """The names of `table`, as an error or a doc lists them."""
    return " | ".join(repr(n) for n in table)


def check(key: str, value: str, table: dict[str, object]) -> str:
    """`value` if it is a key of `table`.

    Raises:
        ConfigError: naming `key`, the value and the allowed names.
    """
    if value not in table:
        raise ConfigError(f"{key} = {value!r} is not allowed: expected one of {allowed(table)}")
    return value
