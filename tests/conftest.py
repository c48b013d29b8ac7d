"""Shared fixtures: a temporary copy of the repo, prepared digits, the local SLURM cluster.

Everything runs on CPU with tiny data. Tests that need a service (SLURM, PostgreSQL, Chromium)
carry a marker and skip with a stated reason only where the service cannot be had. Helpers that
tests call live in helpers.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, copy_repo
from services import browser  # noqa: F401 (one session fixture: Playwright's sync API allows one per thread)


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
    from scalelab.config import DataConfig, build
    from scalelab.data.prepare import prepare

    out = tmp_path_factory.mktemp("prepared")
    prepare(build(DataConfig, {}), out)
    return out


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A git-committed copy of the repo's tracked files (no results, no mlflow.db)."""
    return copy_repo(tmp_path / "repo")


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
