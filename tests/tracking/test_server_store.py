"""slurm/mlflow-server.sh takes its artifact destination from the clone's store (DVC's default
remote): <store>/mlflow-artifacts for an S3 store or a shared folder; the store's credentials never
reach its command line; a store that does not answer stops it in one line (exit 2) before it serves.
Each runs the script with CHECK_ONLY=1 in a small clone of its own."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import BIN, REPO
from services import SERVER_SCRIPT, s3  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def clone_with_store(tmp_path: Path, *remote: str) -> Path:
    """A DVC repository holding the server script and this .venv, with `remote` as its store."""
    clone = tmp_path / "clone"
    (clone / "slurm").mkdir(parents=True)
    shutil.copy2(SERVER_SCRIPT, clone / "slurm/mlflow-server.sh")
    (clone / ".venv").symlink_to(REPO / ".venv")
    subprocess.run([str(BIN / "dvc"), "init", "-q", "--no-scm"], cwd=clone, check=True)
    if remote:
        subprocess.run([str(BIN / "dvc"), "remote", "add", "-q", "-d", "store", *remote], cwd=clone, check=True)
    return clone


def check_only(clone: Path, **env: str) -> subprocess.CompletedProcess:
    settings = ("HOST", "AUTH", "ARTIFACTS_DESTINATION", "AWS_", "MLFLOW_S3_", "MLFLOW_AUTH_")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(settings)}
    full_env.update(CHECK_ONLY="1", ALLOW_NO_AUTH="1", BACKEND_STORE_URI=f"sqlite:///{clone / 'm.db'}", **env)
    script = clone / "slurm/mlflow-server.sh"
    return subprocess.run([str(script)], env=full_env, capture_output=True, text=True, timeout=120)


def test_a_shared_folder_store_keeps_the_artifacts_in_its_mlflow_artifacts(tmp_path):
    shared = tmp_path / "shared-store"
    shared.mkdir()
    proc = check_only(clone_with_store(tmp_path, str(shared)))
    assert proc.returncode == 0, proc.stderr
    assert f"--artifacts-destination {shared}/mlflow-artifacts " in proc.stderr, proc.stderr
    assert (shared / "mlflow-artifacts").is_dir()


def test_without_a_store_the_artifacts_stay_beside_the_clone(tmp_path):
    clone = clone_with_store(tmp_path)
    proc = check_only(clone)
    assert proc.returncode == 0 and f"--artifacts-destination {clone}/mlartifacts " in proc.stderr, proc.stderr


def test_an_s3_store_is_the_destination_and_its_credentials_stay_off_the_command_line(tmp_path, s3):
    store = s3.store()
    clone = clone_with_store(tmp_path, store.url)
    dvc = [str(BIN / "dvc"), "remote", "modify", "-q", "--local", "store"]
    subprocess.run([*dvc, "endpointurl", s3.endpoint], cwd=clone, check=True)
    subprocess.run([*dvc, "access_key_id", s3.access_key_id], cwd=clone, check=True)
    subprocess.run([*dvc, "secret_access_key", s3.secret_access_key], cwd=clone, check=True)
    proc = check_only(clone)
    assert proc.returncode == 0, proc.stderr
    assert "--artifacts-destination s3://scalelab/mlflow-artifacts " in proc.stderr, proc.stderr
    assert f"(store s3://scalelab (endpoint {s3.endpoint}))" in proc.stderr, proc.stderr
    assert s3.secret_access_key not in proc.stderr + proc.stdout
    assert s3.access_key_id not in proc.stderr + proc.stdout

    # the store stopped: one line that names it, exit 2, nothing served
    from scalelab.storage import server

    server.stop(s3.base)
    proc = check_only(clone)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "s3://scalelab" in lines[0] and s3.endpoint in lines[0] and "cannot be reached" in lines[0], lines


def test_an_explicit_destination_wins_over_the_store(tmp_path):
    shared = tmp_path / "shared-store"
    shared.mkdir()
    own = tmp_path / "own-artifacts"
    proc = check_only(clone_with_store(tmp_path, str(shared)), ARTIFACTS_DESTINATION=str(own))
    assert proc.returncode == 0 and f"--artifacts-destination {own} " in proc.stderr, proc.stderr
    assert not (shared / "mlflow-artifacts").exists()
