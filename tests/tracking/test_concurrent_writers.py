"""16 processes log 1,000 metric values each, at once, into one `mlflow server` (the one
slurm/mlflow-server.sh starts), on SQLite and on PostgreSQL; all 16,000 are read back through the
server. Each process uses the tracker as a training job does: log_metrics every step,
flush(wait=False) every CHECKPOINT_EVERY steps (the writer process stores), finish() at the end.

.venv/bin/pytest -q tests/tracking/test_concurrent_writers.py
"""

import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from helpers import record_reliability
from services import mlflow_server_script, postgres  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROCESSES, KEYS, STEPS, CHECKPOINT_EVERY = 16, 10, 100, 25

JOB = f"""
import sys
from scalelab.tracking import MlflowTracker
index = int(sys.argv[1])
tracker = MlflowTracker.open("concurrent", run_name=f"writer-{{index}}")
for step in range(1, {STEPS} + 1):
    tracker.log_metrics({{f"m{{k}}": index * 1e6 + k * 1e3 + step for k in range({KEYS})}}, step)
    if step % {CHECKPOINT_EVERY} == 0:
        tracker.flush(wait=False)
tracker.finish()
print(tracker.run_id)
"""


def log_concurrently(url: str) -> dict[int, str]:
    """Starts every process at once; returns process index -> run id."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": url}
    procs = [
        subprocess.Popen([sys.executable, "-c", JOB, str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(PROCESSES)
    ]
    runs = {}
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
        runs[i] = out.decode().split()[-1]
    return runs


def read_back(url: str, runs: dict[int, str]) -> int:
    """Checks every value, step and status through the server; returns the values stored."""
    client, stored = MlflowClient(url), 0
    for index, run_id in runs.items():
        assert client.get_run(run_id).info.status == "FINISHED"
        for k in range(KEYS):
            history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, f"m{k}"))
            assert history == [(s, index * 1e6 + k * 1e3 + s) for s in range(1, STEPS + 1)], (index, k)
            stored += len(history)
    return stored


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_16_processes_store_all_16000_values_through_one_server(backend, tmp_path, request):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}" if backend == "sqlite" else request.getfixturevalue("postgres").uri
    with mlflow_server_script(uri, tmp_path / "artifacts", tmp_path / "server.log") as server:
        runs = log_concurrently(server.url)
        stored = read_back(server.url, runs)
    sent = PROCESSES * KEYS * STEPS
    record_reliability(
        f"concurrent_writers_{backend}",
        {"processes": PROCESSES, "metric_values_sent": sent, "metric_values_stored": stored},
    )
    assert stored == sent == 16_000
