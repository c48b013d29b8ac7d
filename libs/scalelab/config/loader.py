"""The strict loader: YAML -> frozen dataclasses (the schema itself is `scalelab.config.schema`).

Every stage calls `load_params(path)` before it starts a process, a job or an MLflow run. Unknown
keys, wrong types and out-of-range values raise `ConfigError`, whose one-line message names the
key, the bad value and what is allowed. Workload model sections (`train.model`, `speedup.model`)
are checked by the same code against the workload's own `Config` dataclass.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A bad value in params.yaml or on the command line; the message is meant for the user."""

    exit_status = 2  # the CLI's "bad input"


def knob(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with a default, bounds and a one-line meaning."""
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "doc": doc}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: _copy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


# keys that were renamed: the error names the new one
RENAMED = {"train.warmup_steps": "train.untimed_steps (an LR warm-up is train.lr_warmup_steps)"}

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_name(key: str, value: str) -> None:
    """Names are names, never paths: letters, digits, '_', '.', '-', at most 64, no '..'."""
    if not NAME.match(value) or ".." in value:
        raise _bad(key, value, "a name of letters, digits, '_', '.' and '-' (at most 64, no '/' or '..')")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key} = {value!r} is not allowed: {allowed}")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Checks `value` against the annotation `tp`; returns the value in its typed form."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin is Literal:
        if value not in args:
            raise _bad(key, value, f"expected one of {_type_name(tp)}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                continue
        raise _bad(key, value, f"expected {_type_name(tp)}")
    if origin is list:
        if not isinstance(value, list):
            raise _bad(key, value, f"expected a list ({_type_name(tp)})")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _bad(key, value, f"expected a mapping ({_type_name(tp)})")
        return {str(k): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is type(None):
        if value is not None:
            raise _bad(key, value, "expected null")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise _bad(key, value, "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(key, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _bad(key, value, "expected a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _bad(key, value, "expected a string")
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def _check_bounds(field: dataclasses.Field, value: Any, key: str) -> None:
    meta = field.metadata
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = [
        ("ge", lambda b: value >= b, ">="),
        ("gt", lambda b: value > b, ">"),
        ("le", lambda b: value <= b, "<="),
        ("lt", lambda b: value < b, "<"),
    ]
    for name, ok, sign in checks:
        bound = meta.get(name)
        if bound is not None and not ok(bound):
            raise _bad(key, value, f"must be {sign} {bound}")


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Builds dataclass `cls` from a mapping, rejecting unknown keys, wrong types and bounds.

    Args:
        cls: a dataclass whose annotations give the allowed types.
        data: the mapping read from YAML (None means all defaults).
        prefix: the dotted key of this section, used in error messages.

    Returns:
        An instance of `cls`.
    """
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise _bad(prefix or "<root>", data, f"expected a mapping with keys {_field_names(cls)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        if key in RENAMED:
            raise ConfigError(f"{key} is not a known key: it was renamed to {RENAMED[key]}")
        raise ConfigError(
            f"{key} is not a known key; allowed keys under {prefix or 'the top level'}: {_field_names(cls)}"
        )
    values = {}
    for name, field in fields.items():
        if name not in data:
            continue
        key = f"{prefix}.{name}" if prefix else name
        values[name] = _coerce(hints[name], data[name], key)
        _check_bounds(field, values[name], key)
    obj = cls(**values)
    check = getattr(obj, "check", None)
    if check is not None:
        check(prefix)
    return obj


def _field_names(cls: type) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls) if f.init)


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain dicts and lists (for YAML, JSON and MLflow)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {"a.b.c": value}; lists are kept as values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading floats as YAML 1.2 (and DVC) do: `1e-3` is 0.001, not a string."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _mapping_without_duplicates(loader: YamlLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A mapping whose keys are unique: a second `train:` section is an error, not an override."""
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        if isinstance(key, Hashable):
            seen.add(key)
    return loader.construct_mapping(node, deep)


YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def parse_yaml(text: str, source: str) -> Any:
    """Parses YAML text with `YamlLoader`; malformed text is a ConfigError naming `source`."""
    try:
        return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}".replace("\n", " ")) from None
    except RecursionError:
        raise ConfigError(f"{source} is nested too deeply to be params") from None


def read_yaml(path: str | Path) -> Any:
    """Reads a YAML file; a missing, unreadable or malformed file is a ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; pass the params file with --params")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_yaml(text, str(path))
