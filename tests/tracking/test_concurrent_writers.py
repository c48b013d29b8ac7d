"""16 processes log 1,000 metric values each, at once, into one `mlflow server` (the one
slurm/mlflow-server.sh starts), on SQLite and on PostgreSQL; all 16,000 are read back through the
server. Each process uses the tracker as a training job does: log_metrics every step,
flush(wait=False) every CHECKPOINT_EVERY steps (the writer process stores), finish() at the end.
The 16 are forked from one process that has imported MLflow, so that they do not each spend about
a second of CPU importing it before they log.

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
import os, sys, traceback
from scalelab.tracking import MlflowTracker
from mlflow import MlflowClient  # noqa: F401  (imported once here, not by each process below)
import mlflow.store.tracking.rest_store  # noqa: F401

def log(index):
    tracker = MlflowTracker.open("concurrent", run_name=f"writer-{{index}}")
    for step in range(1, {STEPS} + 1):
        tracker.log_metrics({{f"m{{k}}": index * 1e6 + k * 1e3 + step for k in range({KEYS})}}, step)
        if step % {CHECKPOINT_EVERY} == 0:
            tracker.flush(wait=False)
    tracker.finish()
    with open(os.path.join(sys.argv[1], str(index)), "w") as fh:
        fh.write(tracker.run_id)

children = []
for index in range({PROCESSES}):
    pid = os.fork()
    if pid == 0:
        try:
            log(index)
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    children.append(pid)
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in children))
"""


def log_concurrently(url: str, folder) -> dict[int, str]:
    """Starts every process at once (forked from one that has imported the tracker, so that the
    16 do not each import MLflow); returns process index -> run id."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": url}
    folder.mkdir()
    cmd = [sys.executable, "-c", JOB, str(folder)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {int(path.name): path.read_text() for path in folder.iterdir()}  # each process writes its run id
    assert sorted(runs) == list(range(PROCESSES)), proc.stderr[-3000:]
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
    with mlflow_server_script(uri, tmp_path / "artifacts", tmp_path / "server.log", ALLOW_NO_AUTH="1") as server:
        runs = log_concurrently(server.url, tmp_path / "runs")
        stored = read_back(server.url, runs)
    sent = PROCESSES * KEYS * STEPS
    record_reliability(
        f"concurrent_writers_{backend}",
        {"processes": PROCESSES, "metric_values_sent": sent, "metric_values_stored": stored},
    )
    assert stored == sent == 16_000
