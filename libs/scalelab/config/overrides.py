"""`-S key=value` overrides, read as `dvc exp run -S` reads them.

    -S train.lr=1e-3                        # one value: a float, as YAML 1.2 reads it
    -S train.lr=0.001,0.003                 # a sweep axis: values split on top-level commas
    -S 'train.model.hidden=[64,64],[128]'   # list values in brackets

Values are data: each one is parsed as YAML (never by a shell) and then validated by the schema.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from scalelab.config.loader import ConfigError, parse_yaml

OPEN, CLOSE = "[{", "]}"


def split_values(text: str) -> list[str]:
    """Splits on commas outside brackets, braces and quotes: '[1,2],3' -> ['[1,2]', '3']."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in OPEN:
            depth += 1
        elif ch in CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def parse_value(text: str, key: str) -> Any:
    """One value as YAML; an unparsable one is a ConfigError naming the key."""
    try:
        return parse_yaml(text, f"-S {key}={text}")
    except ConfigError as exc:
        raise ConfigError(f"{exc}; write lists in brackets, e.g. -S {key}=[64,64]") from None


def parse_overrides(specs: list[str]) -> dict[str, list[Any]]:
    """['train.lr=0.1,0.2'] -> {'train.lr': [0.1, 0.2]}."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"-S {spec!r} is not allowed: write -S section.key=value1,value2")
        grid[key] = [parse_value(v, key) for v in split_values(values)]
    return grid


def expand(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, as {key: value} dicts."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def apply(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of the params tree `raw` with each dotted key set."""
    out = copy.deepcopy(raw)
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"-S {key}: {part} is not a section")
        node[leaf] = value
    return out
