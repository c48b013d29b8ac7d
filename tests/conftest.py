"""Shared fixtures: tiny params, a temporary copy of the repo, and a CLI runner.

Everything runs on CPU with tiny data. Tests that need a service (SLURM, PostgreSQL, Chromium)
carry a marker and skip with a stated reason only where the service cannot be had.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tiny_params(**sections: dict[str, Any]) -> dict[str, Any]:
    """params.yaml shrunk to seconds of work; `sections` update it key by key (nested)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"].update(epochs=2, batch_size=32, checkpoint_every_steps=10, log_every_steps=5,
                           warmup_steps=2, model={"hidden": [32], "dropout": 0.1})
    return merge(params, sections)


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and key != "model":
            merge(base[key], value)
        else:
            base[key] = value
    return base


def write_params(path: Path, params: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs `scalelab ARGS` (or another .venv tool when args[0] is one) in `cwd`."""
    tool = args[0] if (BIN / args[0]).exists() and args[0] in ("dvc", "mlflow", "torchrun") else None
    cmd = [str(BIN / tool), *args[1:]] if tool else [str(BIN / "scalelab"), *args]
    full_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-5000:]}")
    return proc


def training_pipeline(repo: Path, params: dict[str, Any], commit: bool = False) -> dict[str, Any]:
    """Writes `params` without the speedup section and a dvc.yaml of prepare/train/evaluate only."""
    params = {k: v for k, v in params.items() if k != "speedup"}
    write_params(repo / "params.yaml", params)
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())
    stages["stages"] = {k: v for k, v in stages["stages"].items() if k in ("prepare", "train", "evaluate")}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(stages, sort_keys=False))
    if commit:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "tiny"],
                       cwd=repo, check=True)
    return params


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder with a dvc.yaml marker, so the MLflow store lands inside it."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/prepared for the default digits source, built once per session."""
    from scalelab import data
    from scalelab.config import build
    from scalelab.params import DataConfig

    out = tmp_path_factory.mktemp("prepared")
    data.prepare(build(DataConfig, {}), out)
    return out


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A git-committed copy of the repo's tracked files (no results, no mlflow.db)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    dest = tmp_path / "repo"
    for rel in files:
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "test copy"], cwd=dest, check=True)
    return dest


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """The local SLURM cluster (slurm/local/): reused if SLURM_CONF points at a live one, else
    installed and started here, which needs root (CI runs as root)."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        if not _is_root():
            pytest.skip("the local SLURM cluster needs root to install and start (slurm/local/start.sh)")
        subprocess.run([str(REPO / "slurm/local/install.sh")], check=True, capture_output=True)
        subprocess.run([str(REPO / "slurm/local/start.sh")], check=True, capture_output=True)
        conf = "/tmp/scalelab-slurm/slurm.conf"
        os.environ["SLURM_CONF"] = conf
    return {"SLURM_CONF": conf}
