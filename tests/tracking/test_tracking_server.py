"""The shared tracking server, slurm/mlflow-server.sh: on a real PostgreSQL, fed by a 2-process DDP
job; and locked down (basic auth, loopback, no path traversal, no foreign Host or origin, owner-only
files, the admin password checked on every start, basic auth on every bind unless ALLOW_NO_AUTH=1),
proven against one running server.

.venv/bin/pytest -q tests/tracking/test_tracking_server.py
"""

import base64
import http.client
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from mlflow import MlflowClient

from helpers import run_cli, tiny_params, write_params
from services import (  # noqa: F401 (fixture)
    free_port,
    listening_addresses,
    mlflow_server_script,
    postgres,
    run_server_script,
)

# one worker runs the module (the postgres group's): locked_server starts once, not once per worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("postgres")]

EPOCHS, LOG_EVERY, WARMUP = 2, 5, 2


def expected_steps(total: int) -> dict[str, list[int]]:
    """Each metric's steps for a run of `total` optimizer steps (see train._train and engine.Meter)."""
    logged = [s for s in range(1, total + 1) if s % LOG_EVERY == 0 or s == total]
    timed = [s for s in logged if s > WARMUP]
    per_epoch = total // EPOCHS
    epochs = [per_epoch * (e + 1) for e in range(EPOCHS)]
    return {
        "train_loss": logged,
        "lr": logged,
        "grad_norm": logged,
        "samples_per_s": timed,
        "step_time_ms": timed,
        "mean_samples_per_s": [total],
        "mean_step_time_ms": [total],
        "val_loss": epochs,
        "val_accuracy": epochs,
        "ranks_in_sync": [total],
        "best_step": [total],
        "best_val_loss": [total],
    }


@pytest.mark.postgres
def test_ddp_job_logs_every_metric_to_postgres_backed_server(workdir, prepared_digits, postgres, tmp_path):
    artifacts = tmp_path / "shared-artifacts"
    with mlflow_server_script(postgres.uri, artifacts, tmp_path / "server.log", ALLOW_NO_AUTH="1") as server:
        # the script's default bind: loopback only
        assert listening_addresses(server.port) == {"127.0.0.1"}, listening_addresses(server.port)

        write_params(
            workdir / "params.yaml",
            tiny_params(train={"epochs": EPOCHS, "log_every_steps": LOG_EVERY, "untimed_steps": WARMUP}),
        )
        run_cli(
            "train",
            "--params",
            "params.yaml",
            "--data",
            str(prepared_digits),
            "--out",
            "results/train",
            cwd=workdir,
            env={"MLFLOW_TRACKING_URI": server.url},
        )
        assert not (workdir / "mlflow.db").exists(), "the job wrote to the local SQLite store"

        total = json.loads((workdir / "results/train/metrics.json").read_text())["steps"]
        run_id = json.loads((workdir / "results/train/run.json").read_text())["run_id"]
        client = MlflowClient(server.url)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.info.run_name == "ddp-w2-fp32-seed0"
        assert run.data.tags["scalelab.kind"] == "train" and run.data.params["world_size"] == "2"
        assert total % EPOCHS == 0 and total // EPOCHS > LOG_EVERY, total
        for key, steps in expected_steps(total).items():
            history = client.get_metric_history(run_id, key)
            assert sorted(m.step for m in history) == steps, (key, sorted(m.step for m in history))
        assert {"config.json", "seeds.json", "metrics.json"} <= {a.path for a in client.list_artifacts(run_id)}
        log_tail = server.log.read_text(errors="replace")[-3000:]

    # artifacts went through the server's proxy into the shared folder, metrics into PostgreSQL
    assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
    assert list(artifacts.rglob(f"{run_id}/artifacts/seeds.json")), sorted(artifacts.rglob("*"))
    rows = metric_rows(postgres, run_id)
    assert {k: rows.get(k) for k in expected_steps(total)} == {k: len(s) for k, s in expected_steps(total).items()}, (
        rows,
        log_tail,
    )


def metric_rows(pg, run_id: str) -> dict[str, int]:
    """Rows per metric key in MLflow's `metrics` table for the run, read from PostgreSQL itself."""
    import psycopg2

    with psycopg2.connect(host="127.0.0.1", port=pg.port, user=pg.user, dbname=pg.database) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT key, count(*) FROM metrics WHERE run_uuid = %s GROUP BY key", (run_id,))
            return dict(cur.fetchall())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0.0.0.0", "10.1.2.3", "127.example.com", "127.1"])
def test_script_will_not_serve_without_a_password_on_any_bind(tmp_path, host):
    proc = run_server_script(f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "artifacts", HOST=host)
    assert proc.returncode == 2 and f"HOST={host}" in proc.stderr, proc.stderr
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" in proc.stderr and "ALLOW_NO_AUTH=1" in proc.stderr, proc.stderr
    assert not (tmp_path / "m.db").exists()


# --- the locked-down server: one running `mlflow server` with basic auth for the whole module -------

ADMIN_PASSWORD = "correct-horse-battery-staple"
SECRET = "TOP-SECRET-4f1c9e"  # in a file just outside the artifact root: no request may return it
TRAVERSALS = ["../", "%2e%2e%2f", "%2E%2E%2F", "..%2f", "%252e%252e%252f", "..\\", "..%5c"]


@dataclass(frozen=True)
class Locked:
    url: str
    port: int
    store: Path
    auth_dir: Path
    run_id: str
    experiment_id: str


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory) -> Iterator[Locked]:
    """slurm/mlflow-server.sh with AUTH=basic on SQLite, a run with one artifact, a secret file beside
    the artifact root, and an old store file left readable by everyone (the script must fix it)."""
    store = tmp_path_factory.mktemp("locked")
    (store / "secret.txt").write_text(SECRET)
    (store / "mlflow.db").touch(mode=0o644)
    (store / "mlflow.db").chmod(0o644)
    auth_dir = store / "auth"
    env = {"AUTH": "basic", "AUTH_DIR": str(auth_dir), "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}
    with mlflow_server_script(f"sqlite:///{store / 'mlflow.db'}", store / "artifacts", store / "log", **env) as server:
        creds = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD}
        with mock.patch.dict(os.environ, creds):
            client = MlflowClient(server.url)
            experiment_id = client.create_experiment("locked")
            run_id = client.create_run(experiment_id).info.run_id
            (store / "hello.txt").write_text("hello artifact\n")
            client.log_artifact(run_id, str(store / "hello.txt"))
        yield Locked(server.url, server.port, store, auth_dir, run_id, experiment_id)


def request(server: Locked, method: str, target: str, headers: dict[str, str] | None = None, auth=("admin", None)):
    """One raw request (the target is sent exactly as given: no normalizing of `..` or `%2e`)."""
    user, password = auth
    sent = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ADMIN_PASSWORD}".encode()).decode()
        sent["Authorization"] = f"Basic {token}"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, target, headers=sent)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read().decode(errors="replace")  # headers: any case
    finally:
        conn.close()


SEARCH = "/api/2.0/mlflow/experiments/search?max_results=10"


@pytest.mark.slow  # a served MLflow server (locked_server), started once for these
def test_locked_server_binds_loopback_and_needs_the_right_password(locked_server):
    assert listening_addresses(locked_server.port) == {"127.0.0.1"}
    assert request(locked_server, "GET", SEARCH)[0] == 200  # the control: the right password works
    assert request(locked_server, "GET", SEARCH, auth=(None, None))[0] == 401
    assert request(locked_server, "GET", SEARCH, auth=("admin", "wrong-password-123"))[0] == 401
    assert request(locked_server, "GET", SEARCH, auth=("admin", "password1234"))[0] == 401  # MLflow's old default
    assert request(locked_server, "GET", "/get-artifact?path=hello.txt&run_uuid=x", auth=(None, None))[0] == 401


def traversal_targets(server: Locked) -> list[str]:
    run, exp = server.run_id, server.experiment_id
    targets = []
    for up in TRAVERSALS:  # secret.txt is 1 level above the artifact root, 4 above a run's artifacts
        top, deep = up + "secret.txt", up * 4 + "secret.txt"
        targets += [
            f"/api/2.0/mlflow-artifacts/artifacts/{top}",
            f"/api/2.0/mlflow-artifacts/artifacts/{exp}/{run}/artifacts/{deep}",
            f"/ajax-api/2.0/mlflow-artifacts/artifacts/{top}",
            f"/get-artifact?path={deep}&run_uuid={run}",
            f"/ajax-api/2.0/mlflow/get-artifact?path={deep}&run_uuid={run}",  # no such route in MLflow 3.17: 404
            f"/model-versions/get-artifact?path={deep}&name=m&version=1",
        ]
    return targets


@pytest.mark.slow  # a served MLflow server (locked_server), started once for these
def test_path_traversal_on_artifact_endpoints_gets_4xx_and_no_file_content(locked_server):
    run = locked_server.run_id
    status, _, body = request(locked_server, "GET", f"/get-artifact?path=hello.txt&run_uuid={run}")
    assert status == 200 and "hello artifact" in body, (status, body[:300])  # the endpoints serve files
    own = f"/api/2.0/mlflow-artifacts/artifacts/{locked_server.experiment_id}/{run}/artifacts/hello.txt"
    status, _, body = request(locked_server, "GET", own)
    assert status == 200 and "hello artifact" in body, (status, body[:300])
    leaks = []
    for target in traversal_targets(locked_server):
        status, _, body = request(locked_server, "GET", target)
        if not 400 <= status < 500 or SECRET in body:
            leaks.append((target, status, body[:200]))
    assert not leaks, leaks


@pytest.mark.slow  # a served MLflow server (locked_server), started once for these
def test_a_foreign_host_header_and_a_foreign_cors_preflight_are_refused(locked_server):
    assert request(locked_server, "GET", SEARCH, headers={"Host": "evil.example"})[0] == 403
    assert request(locked_server, "GET", SEARCH, headers={"Host": f"evil.example:{locked_server.port}"})[0] == 403
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    own = f"http://127.0.0.1:{locked_server.port}"
    status, headers, _ = request(locked_server, "OPTIONS", SEARCH, headers={"Origin": own, **preflight})
    assert headers.get("Access-Control-Allow-Origin") == own, (status, headers)  # the control: its own origin
    status, headers, _ = request(
        locked_server, "OPTIONS", SEARCH, headers={"Origin": "http://evil.example", **preflight}
    )
    assert headers.get("Access-Control-Allow-Origin") not in ("http://evil.example", "*"), (status, headers)
    status, _, _ = request(
        locked_server,
        "POST",
        "/api/2.0/mlflow/experiments/create",
        headers={"Origin": "http://evil.example", "Content-Type": "application/json"},
    )
    assert status == 403, status


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow  # a served MLflow server (locked_server), started once for these
def test_store_files_are_readable_by_the_server_user_only(locked_server):
    store, auth = locked_server.store, locked_server.auth_dir
    files = [store / "mlflow.db", auth / "basic_auth.db", auth / "basic_auth.ini", auth / "secret_key"]
    files += [p for p in (store / "artifacts").rglob("*") if p.is_file()]
    assert any(p.name == "hello.txt" for p in files), files  # an artifact written by the server
    assert {str(p): oct(mode(p)) for p in files if mode(p) != 0o600} == {}
    folders = [store / "artifacts", auth] + [p for p in (store / "artifacts").rglob("*") if p.is_dir()]
    assert {str(p): oct(mode(p)) for p in folders if mode(p) != 0o700} == {}


@pytest.mark.parametrize(
    "password, says",
    [
        (None, "every start needs MLFLOW_AUTH_ADMIN_PASSWORD"),
        ("another-password-456", "is not the password of admin user 'admin'"),
        ("password1234", "password1234 is not allowed"),
        (ADMIN_PASSWORD, "settings accepted"),  # the control: CHECK_ONLY=1, so nothing is served
    ],
)
@pytest.mark.slow  # a served MLflow server (locked_server), started once for these
def test_a_restart_needs_the_admin_password(locked_server, password, says):
    env = {"AUTH": "basic", "AUTH_DIR": str(locked_server.auth_dir), "CHECK_ONLY": "1"}
    env |= {"MLFLOW_AUTH_ADMIN_PASSWORD": password} if password else {}
    proc = run_server_script(f"sqlite:///{locked_server.store / 'mlflow.db'}", locked_server.store / "artifacts", **env)
    assert proc.returncode == (0 if password == ADMIN_PASSWORD else 2) and says in proc.stderr, proc.stderr[-2000:]


def test_a_first_start_refuses_mlflows_old_default_password(tmp_path):
    env = {"AUTH": "basic", "AUTH_DIR": str(tmp_path / "auth"), "MLFLOW_AUTH_ADMIN_PASSWORD": "password1234"}
    proc = run_server_script(f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "artifacts", **env)
    assert proc.returncode == 2 and "password1234 is not allowed" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "localhost", "::1", "0.0.0.0"])
def test_allow_no_auth_serves_without_a_password_and_says_so(tmp_path, host):
    proc = run_server_script(
        f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "a", HOST=host, CHECK_ONLY="1", ALLOW_NO_AUTH="1"
    )
    assert proc.returncode == 0 and "auth=" not in proc.stderr and "basic-auth" not in proc.stderr, proc.stderr


def test_allow_no_auth_takes_1_only(tmp_path):
    proc = run_server_script(f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "a", CHECK_ONLY="1", ALLOW_NO_AUTH="yes")
    assert proc.returncode == 2 and "ALLOW_NO_AUTH=yes is not allowed: use 1" in proc.stderr, proc.stderr


def test_the_backend_password_is_never_printed_whatever_it_holds(tmp_path):
    password = "Zq9x@Kw7v:Pm3/Ty8@"
    uri = f"postgresql://alice:{password}@db.example:5432/mlflow"
    proc = run_server_script(uri, tmp_path / "a", CHECK_ONLY="1", ALLOW_NO_AUTH="1")
    assert proc.returncode == 0 and "backend=postgresql+psycopg2://***@db.example:5432/mlflow" in proc.stderr, (
        proc.stderr
    )
    for piece in ["alice", *filter(None, re.split("[@:/]", password))]:
        assert piece not in proc.stderr, (piece, proc.stderr)
