"""Search spaces for `scalelab sweep submit --method tpe|random`, written beside today's lists:

    -S 'train.lr=loguniform(1e-4,1e-1)'             # a float, sampled on a log scale
    -S 'train.dropout=uniform(0,0.5)'               # a float, sampled on a linear scale
    -S 'train.lr_warmup_steps=int(0,200)'           # an integer, both ends included
    -S 'train.batch_size=logint(16,256)'            # an integer, sampled on a log scale
    -S 'train.model.hidden=choice([256,256],[512,512])'  # one of these values (any YAML values)
    -S 'train.optimizer=adamw,sgd'                  # a list, as in a grid: a choice
    -S 'train.epochs=3'                             # one value: every trial gets it

Bounds and choices are YAML values checked here (numbers, ordered bounds, positive ones on a log
scale); what they mean for a key is checked by the params schema, at both ends, before any trial.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from scalelab.config.loader import ConfigError
from scalelab.config.overrides import parse_value, split_values

FUNCTIONS = ("loguniform", "uniform", "int", "logint", "choice")
CALL = re.compile(r"^\s*([a-z_]+)\((.*)\)\s*$", re.DOTALL)
SYNTAX = "loguniform(low,high), uniform(low,high), int(low,high), logint(low,high), choice(v1,v2,...) or v1,v2,..."


@dataclass(frozen=True)
class Dimension:
    """One key of a search space: `kind` is 'float', 'int' or 'choice'."""

    key: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()

    def ends(self) -> list[Any]:
        """The values that bound this dimension: both ends, or every choice."""
        if self.kind == "choice":
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.kind == "int" else [self.low, self.high]

    def distribution(self) -> Any:
        """The Optuna distribution; choices are JSON text, so lists and dicts can be chosen too."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "float":
            return FloatDistribution(self.low, self.high, log=self.log)
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return CategoricalDistribution([json.dumps(c) for c in self.choices])

    def value(self, sampled: Any) -> Any:
        """The params value of an Optuna sample."""
        return json.loads(sampled) if self.kind == "choice" else sampled

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice({', '.join(json.dumps(c) for c in self.choices)})"
        name = {"float": "uniform", "int": "int"}[self.kind]
        return f"{'log' if self.log else ''}{name}({self.ends()[0]}, {self.ends()[1]})"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "low": self.low, "high": self.high, "log": self.log,
                "choices": list(self.choices)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Dimension:
        return cls(d["key"], d["kind"], d["low"], d["high"], d["log"], tuple(d["choices"]))


def parse_space(specs: list[str]) -> dict[str, Dimension]:
    """['train.lr=loguniform(1e-4,1e-1)', 'train.seed=0,1'] -> {key: Dimension}.

    Raises:
        ConfigError: one line naming the spec, what is wrong, and the syntax.
    """
    space: dict[str, Dimension] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        if not sep or not key or not text.strip():
            raise ConfigError(f"-S {spec!r} is not allowed: write -S section.key=<space>, with <space> one of {SYNTAX}")
        if key in space:
            raise ConfigError(f"-S {key} is given twice: give each key once")
        space[key] = _dimension(key, text)
    return space


def _dimension(key: str, text: str) -> Dimension:
    call = CALL.match(text)
    if call and call.group(1) not in FUNCTIONS:
        raise ConfigError(f"-S {key}={text}: {call.group(1)!r} is not a search function; write one of {SYNTAX}")
    if not call and re.match(r"^\s*[a-z_]+\(", text):
        raise ConfigError(f"-S {key}={text}: the parenthesis is not closed; write one of {SYNTAX}")
    if not call:
        return Dimension(key, "choice", choices=_unique(key, [parse_value(v, key) for v in split_values(text)]))
    name, inner = call.group(1), call.group(2)
    args = [parse_value(v, key) for v in split_values(inner)] if inner.strip() else []
    if name == "choice":
        return Dimension(key, "choice", choices=_unique(key, args))
    where = f"-S {key}={text}"
    if len(args) != 2:
        raise ConfigError(f"{where}: {name} takes two bounds, (low,high); got {len(args)}")
    low, high = args
    integral = name in ("int", "logint")
    kinds = (int,) if integral else (int, float)
    if any(isinstance(v, bool) or not isinstance(v, kinds) or not math.isfinite(v) for v in (low, high)):
        wanted = "integers" if integral else "finite numbers"
        raise ConfigError(f"{where}: the bounds of {name} must be {wanted}; got {low!r} and {high!r}")
    if not low < high:
        raise ConfigError(f"{where}: low = {low} must be below high = {high}")
    log = name.startswith("log")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0; got {low}")
    return Dimension(key, "int" if integral else "float", float(low), float(high), log)


def _unique(key: str, values: list[Any]) -> tuple[Any, ...]:
    if not values or len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
        raise ConfigError(f"-S {key}: the choices {values} are not allowed: give one or more values, each once")
    return tuple(values)


def corners(space: dict[str, Dimension]) -> list[dict[str, Any]]:
    """Assignments that put every bound and every choice in front of the schema at least once:
    the first of each dimension together, then each other value alone (the rest at their first)."""
    first = {k: d.ends()[0] for k, d in space.items()}
    out = [first]
    for key, dim in space.items():
        out += [{**first, key: v} for v in dim.ends()[1:]]
    return out
