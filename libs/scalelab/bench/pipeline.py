"""What the pipeline benchmarks share: params with overrides, prepared data, a private MLflow store.

The profiler, loader and DVC benchmarks measure the pipeline as `dvc repro` runs it, from
params.yaml, shrunk only where their `--set section.key=value` options say (tests use them).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from scalelab.config import ConfigError, Params, parse_params, read_yaml
from scalelab.config.overrides import apply, parse_overrides
from scalelab.launch.local import worker_command

SET_OPTION = (
    "--set",
    {
        "dest": "sets",
        "action": "append",
        "default": [],
        "metavar": "KEY=VALUE",
        "help": "override a params key, as -S does (repeatable), e.g. --set train.epochs=2",
    },
)


def params_tree(path: str | Path, sets: list[str]) -> dict[str, Any]:
    """params.yaml at `path` with `sets` applied, validated (errors name the key)."""
    grid = parse_overrides(sets)
    multi = [k for k, v in grid.items() if len(v) != 1]
    if multi:
        raise ConfigError(f"--set {multi[0]}: give one value, not a sweep")
    raw = apply(read_yaml(path), {k: v[0] for k, v in grid.items()})
    parse_params(raw, str(path))
    return raw


def write_params(path: Path, raw: dict[str, Any]) -> Path:
    """Writes a params file that `scalelab` accepts: inside a repository (its folder gets a
    `dvc.yaml` marker when no folder above holds one, as in a test's temporary folder)."""
    from scalelab.runtime.paths import find_repo

    if find_repo(path.parent) is None:
        (path.parent / "dvc.yaml").write_text("stages: {}\n")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def parsed(raw: dict[str, Any]) -> Params:
    return parse_params(raw, "params")


def prepare_data(raw: dict[str, Any], out: Path) -> Path:
    """`scalelab prepare`'s work in this process: the pipeline's data/prepared, under `out`."""
    from scalelab.data.prepare import prepare

    params = parsed(raw)
    prepare(params.data, out, min_train_samples=params.train.global_batch)
    return out


def store_env(store_dir: Path, tracking: bool = True) -> dict[str, str]:
    """This environment with a fresh SQLite MLflow store in `store_dir`; with `tracking`, its
    schema is made now, so that no timed run pays for creating it."""
    uri = f"sqlite:///{store_dir / 'mlflow.db'}"
    if tracking:
        from scalelab.tracking import runs

        runs.client(uri).search_experiments()
    return {**os.environ, "MLFLOW_TRACKING_URI": uri}


def scalelab(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `scalelab ARGS` in a fresh process; raises RuntimeError with its stderr tail on failure."""
    proc = subprocess.run(worker_command(list(args)), cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"scalelab {' '.join(args)} exited {proc.returncode}: {tail[-800:]}")
    return proc
