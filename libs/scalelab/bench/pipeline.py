"""What the pipeline benchmarks share: params with `--set` overrides, prepared data, a private
MLflow store, `scalelab` and `git` as fresh processes, a committed copy of the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from scalelab.config import ConfigError, Params, parse_params, read_yaml
from scalelab.config.overrides import apply, parse_overrides
from scalelab.data.prepare import prepare
from scalelab.launch.local import worker_command
from scalelab.runtime.paths import find_repo
from scalelab.tracking import runs

SET_HELP = "override a params key, as -S does (repeatable), e.g. --set train.epochs=2"
SET_OPTION = ("--set", {"dest": "sets", "action": "append", "default": [], "metavar": "KEY=VALUE", "help": SET_HELP})
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"]


def params_tree(path: str | Path, sets: list[str]) -> dict[str, Any]:
    """params.yaml at `path` with `sets` applied, validated (errors name the key)."""
    grid = parse_overrides(sets)
    if multi := [k for k, v in grid.items() if len(v) != 1]:
        raise ConfigError(f"--set {multi[0]}: give one value, not a sweep")
    raw = apply(read_yaml(path), {k: v[0] for k, v in grid.items()})
    parse_params(raw, str(path))
    return raw


def write_params(path: Path, raw: dict[str, Any]) -> Path:
    """A params file inside a repository (a `dvc.yaml` marker when no folder above holds one)."""
    if find_repo(path.parent) is None:
        (path.parent / "dvc.yaml").write_text("stages: {}\n")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def parsed(raw: dict[str, Any]) -> Params:
    return parse_params(raw, "params")


def prepare_data(raw: dict[str, Any], out: Path) -> Path:
    """`scalelab prepare`'s work in this process: the pipeline's data/prepared, under `out`."""
    params = parsed(raw)
    prepare(params.data, out, min_train_samples=params.train.global_batch)
    return out


def store_env(store_dir: Path, tracking: bool = True) -> dict[str, str]:
    """This environment with a fresh SQLite MLflow store in `store_dir` (its schema made now, untimed)."""
    uri = f"sqlite:///{store_dir / 'mlflow.db'}"
    if tracking:
        runs.client(uri).search_experiments()
    return {**os.environ, "MLFLOW_TRACKING_URI": uri}


def run(cmd: list[str], what: str, ok=(0,), **kw: Any) -> subprocess.CompletedProcess:
    """Runs `cmd` (`kw`: subprocess.run's), output captured; RuntimeError with its tail unless its status is `ok`."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode not in ok:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        raise RuntimeError(f"{what} exited {proc.returncode}: {tail[-1500:]}")
    return proc


def scalelab(*args: str, cwd: Path | None = None, env: dict | None = None, ok=(0,)) -> subprocess.CompletedProcess:
    """Runs `scalelab ARGS` in a fresh process; RuntimeError with its output's tail unless its status is `ok`."""
    return run(worker_command(list(args)), f"scalelab {' '.join(args)}", ok, cwd=cwd, env=env)


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def edit_params(repo: Path, values: dict[str, Any]) -> None:
    path = repo / "params.yaml"
    path.write_text(yaml.safe_dump(apply(yaml.safe_load(path.read_text()), values), sort_keys=False))


def committed_copy(repo: Path, dest: Path, values: dict[str, Any] | None = None) -> Path:
    """The files git would commit (tracked and untracked, not ignored), params.yaml changed by
    `values`, committed in a fresh repository."""
    for rel in filter(None, git(repo, "ls-files", "-co", "--exclude-standard", "-z").split("\0")):
        if (repo / rel).is_file() and not (repo / rel).is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, dest / rel)
    if values:
        edit_params(dest, values)
    for step in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-qm", "bench copy")):
        git(dest, *step)
    return dest
