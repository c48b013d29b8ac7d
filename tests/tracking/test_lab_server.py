"""The lab's tracking server keeps its artifacts in the lab's store and serves them; other clones
point at it from their git-ignored .scalelab.local.yaml.

One lab for the module: a real S3 store (`rclone serve s3`, the server of `make store`), clone A
of a bare git remote with that store as its DVC remote, and slurm/mlflow-server.sh started from A
with its defaults (basic auth, artifacts in <store>/mlflow-artifacts, the store's credentials
from A's .dvc/config.local, none in the test's environment). A runs the pipeline with the
profiler on, logging to the server through .scalelab.local.yaml, then `dvc push`es and pushes git.

.venv/bin/pytest -p no:randomly tests/tracking/test_lab_server.py
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from helpers import BIN, REPO, copy_repo, free_port, once_more_if_heap_crash, tiny_params, training_pipeline
from services import SERVER_SCRIPT, s3_server, serve, server_script_env

# one worker builds the lab (a server, a store, two clones: ~2 min) for all four tests, not one per worker
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("lab-server")]

PASSWORD = "lab-admin-password-7c1e"  # the server's admin (MLflow basic auth, on by default)
USER_ENV = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]


@dataclass(frozen=True)
class Lab:
    url: str
    store: object  # scalelab.storage.server.Server
    origin: Path
    clone: Path  # A: ran the pipeline, pushed data and code
    run_id: str


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any store credentials, tracking settings or workspace pointers."""
    drop = ("AWS_", "MLFLOW_TRACKING_", "MLFLOW_S3_", "SCALELAB_REPO", "DVC_ROOT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "PATH": f"{BIN}:{os.environ['PATH']}", **extra}


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("lab")
    with s3_server(tmp / "s3") as store:
        origin = tmp / "origin.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
        clone = copy_repo(tmp / "A")
        (clone / ".git/info/exclude").write_text("/.venv\n")
        (clone / ".venv").symlink_to(REPO / ".venv")  # the script runs the clone's .venv
        profile = {"enabled": True, "wait": 1, "warmup": 1, "active": 2}
        training_pipeline(clone, tiny_params(train={"profile": profile}, tracking={"system_metrics_interval_s": 0}))
        keys = {"AWS_ACCESS_KEY_ID": store.access_key_id, "AWS_SECRET_ACCESS_KEY": store.secret_access_key}
        scalelab = str(BIN / "scalelab")
        run(
            [scalelab, "store", "set", "s3://scalelab", "--endpoint", store.endpoint, "--repo", "."],
            clone,
            clean_env(**keys),
        )
        run([*GIT, "add", "-A"], clone, clean_env())
        run([*GIT, "commit", "-qm", "the lab's pipeline and store"], clone, clean_env())
        run(["git", "remote", "add", "origin", str(origin)], clone, clean_env())

        server_dir = tmp / "server"
        port = free_port()
        env = server_script_env(f"sqlite:///{server_dir / 'mlflow.db'}", server_dir / "unused", port)
        env = {k: v for k, v in env.items() if not k.startswith(("AWS_", "MLFLOW_S3_"))}
        env.pop("ARTIFACTS_DESTINATION")  # derived from the clone's store
        env.update(AUTH_DIR=str(server_dir / "auth"), MLFLOW_AUTH_ADMIN_PASSWORD=PASSWORD)
        script = clone / SERVER_SCRIPT.relative_to(REPO)
        with serve([str(script)], port, server_dir / "server.log", env=env) as server:
            (clone / ".scalelab.local.yaml").write_text(f"tracking_uri: {server.url}\n")
            once_more_if_heap_crash(lambda: run([str(BIN / "dvc"), "repro"], clone, clean_env(**USER_ENV)))
            run([str(BIN / "dvc"), "push"], clone, clean_env())  # the store's credentials: .dvc/config.local
            run([*GIT, "add", "-A"], clone, clean_env())
            run([*GIT, "commit", "-qm", "dvc.lock of the lab's run"], clone, clean_env())
            run(["git", "push", "-q", "origin", "main"], clone, clean_env())
            run_id = json.loads((clone / "results/train/run.json").read_text())["run_id"]
            yield Lab(server.url, store, origin, clone, run_id)


def test_the_server_starts_with_auth_and_its_artifacts_in_the_store(lab):
    log = (lab.clone.parent / "server/server.log").read_text()
    assert "artifacts=s3://scalelab/mlflow-artifacts" in log and "auth=basic" in log, log[-3000:]
    assert lab.store.secret_access_key not in log and lab.store.access_key_id not in log
    request = urllib.request.Request(f"{lab.url}/api/2.0/mlflow/experiments/search?max_results=1")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401  # no password: refused


# a client that imports scalelab (its default: through the server), and a plain MLflow client set up
# as the README says
SCALELAB_CLIENT = (
    "import sys, scalelab.tracking; from mlflow import MlflowClient; "
    "MlflowClient(sys.argv[1]).download_artifacts(sys.argv[2], '', sys.argv[3])"
)


@pytest.mark.parametrize("client", ["scalelab", "mlflow"])
def test_profiler_traces_and_artifacts_download_through_the_server_without_store_credentials(lab, tmp_path, client):
    home = tmp_path / "home"  # no ~/.aws, no AWS_* variables: this client cannot reach the store
    home.mkdir()
    dest = tmp_path / "downloaded"
    dest.mkdir()
    env = clean_env(HOME=str(home), MLFLOW_TRACKING_URI=lab.url, **USER_ENV)
    if client == "scalelab":
        run([str(BIN / "python"), "-c", SCALELAB_CLIENT, lab.url, lab.run_id, str(dest)], tmp_path, env)
    else:
        env["MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD"] = "false"
        run([str(BIN / "mlflow"), "artifacts", "download", "-r", lab.run_id, "-d", str(dest)], tmp_path, env)
    got = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}

    traces = sorted((lab.clone / "results/train/profile").iterdir())
    assert traces, "the job wrote no profiler files"
    for path in traces:  # the job's own files, byte for byte
        assert got.get(f"profile/{path.name}") == path.read_bytes(), (path.name, sorted(got))
    assert got["metrics.json"] == (lab.clone / "results/train/metrics.json").read_bytes()

    # every artifact is an object in the bucket (rclone keeps objects as files under <base>/data/<bucket>)
    objects = lab.store.base_path / "data/scalelab/mlflow-artifacts"
    stored = {str(p.relative_to(objects)): p for p in objects.rglob("*") if p.is_file()}
    for name, blob in got.items():
        found = [p for rel, p in stored.items() if rel.endswith(f"{lab.run_id}/artifacts/{name}")]
        assert len(found) == 1 and found[0].read_bytes() == blob, (name, sorted(stored)[:20])

    from mlflow import MlflowClient

    with mock.patch.dict(os.environ, USER_ENV):
        stored_run = MlflowClient(lab.url).get_run(lab.run_id)
    assert stored_run.info.artifact_uri.startswith("mlflow-artifacts:"), stored_run.info.artifact_uri
    shown = json.dumps([stored_run.data.params, stored_run.data.tags])
    assert lab.store.secret_access_key not in shown and lab.store.access_key_id not in shown


def test_reproduce_in_a_third_clone_pulls_its_data_from_the_store_and_matches(lab, tmp_path):
    third = tmp_path / "C"
    run(["git", "clone", "-q", str(lab.origin), str(third)], tmp_path, clean_env())
    assert not (third / "data/prepared").exists() and not (third / ".dvc/cache").exists()
    (third / ".scalelab.local.yaml").write_text(f"tracking_uri: {lab.url}\n")
    keys = {"AWS_ACCESS_KEY_ID": lab.store.access_key_id, "AWS_SECRET_ACCESS_KEY": lab.store.secret_access_key}
    proc = run([str(BIN / "scalelab"), "reproduce", lab.run_id, "--yes"], third, clean_env(**keys, **USER_ENV))
    print(proc.stdout)  # the table, shown with `pytest -rP`
    assert "RESULT: match" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "pulling data/prepared from the store s3://scalelab" in proc.stderr, proc.stderr[-3000:]
    assert (third / "data/prepared").is_dir() and not (third / "mlflow.db").exists()
    rows = {line.split("  ")[0]: line for line in proc.stdout.splitlines()}
    assert rows["weights sha256"].endswith("match"), rows

    from mlflow import MlflowClient

    with mock.patch.dict(os.environ, USER_ENV):
        client = MlflowClient(lab.url)
        experiment = client.get_run(lab.run_id).info.experiment_id
        new = client.search_runs([experiment], f"tags.`scalelab.reproduces` = '{lab.run_id}'")
    assert len(new) == 1, new  # the reproduction is on the lab's server, beside the original


def test_ui_and_summary_in_a_pointed_clone_name_the_lab_server(lab):
    env = clean_env(**USER_ENV)
    shown = run([str(BIN / "scalelab"), "ui", "--params", "params.yaml"], lab.clone, env, timeout=120).stdout
    assert f"MLflow UI (the lab's server), experiment 'scalelab': {lab.url}/#/experiments/" in shown, shown
    summary = run([str(BIN / "scalelab"), "summary"], lab.clone, env, timeout=120).stdout
    assert f"store: {lab.url})" in summary, summary
    assert not (lab.clone / "mlflow.db").exists()  # nothing went to a local store
