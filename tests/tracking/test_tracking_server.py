"""The shared tracking server: slurm/mlflow-server.sh on a real PostgreSQL, fed by a 2-process DDP job.

.venv/bin/pytest -q tests/integration/test_tracking_server.py
"""

import json
import os
import subprocess

import pytest
from mlflow import MlflowClient

from helpers import REPO, run_cli, tiny_params, write_params
from services import free_port, listening_addresses, mlflow_server_script, postgres  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

EPOCHS, LOG_EVERY, WARMUP = 2, 5, 2


def expected_steps(total: int) -> dict[str, list[int]]:
    """Each metric's steps for a run of `total` optimizer steps (see train._train and engine.Meter)."""
    logged = [s for s in range(1, total + 1) if s % LOG_EVERY == 0 or s == total]
    timed = [s for s in logged if s > WARMUP]
    per_epoch = total // EPOCHS
    epochs = [per_epoch * (e + 1) for e in range(EPOCHS)]
    return {
        "train_loss": logged,
        "samples_per_s": timed + [total],
        "step_time_ms": timed + [total],
        "val_loss": epochs,
        "val_accuracy": epochs,
        "ranks_in_sync": [total],
    }


@pytest.mark.postgres
def test_ddp_job_logs_every_metric_to_postgres_backed_server(workdir, prepared_digits, postgres, tmp_path):
    artifacts = tmp_path / "shared-artifacts"
    with mlflow_server_script(postgres.uri, artifacts, tmp_path / "server.log") as server:
        # the script's default bind: loopback only
        assert listening_addresses(server.port) == {"127.0.0.1"}, listening_addresses(server.port)

        write_params(
            workdir / "params.yaml",
            tiny_params(train={"epochs": EPOCHS, "log_every_steps": LOG_EVERY, "warmup_steps": WARMUP}),
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


def test_script_will_not_expose_the_server_without_a_password(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("AUTH", "ALLOW_NO_AUTH")}
    env.update(
        HOST="0.0.0.0",
        PORT=str(free_port()),
        BACKEND_STORE_URI=f"sqlite:///{tmp_path / 'm.db'}",
        ARTIFACTS_DESTINATION=str(tmp_path / "artifacts"),
    )
    proc = subprocess.run([str(REPO / "slurm/mlflow-server.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "HOST=0.0.0.0" in proc.stderr and "AUTH=basic" in proc.stderr, proc.stderr
    assert not (tmp_path / "m.db").exists()
