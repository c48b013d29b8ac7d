"""No metric is dropped when the tracking server goes away: a 2-process DDP job against a real
`mlflow server` (slurm/mlflow-server.sh on SQLite) that dies (SIGKILL) mid-run and is started
again once the job's metric writer has failed to store, or that dies for good and comes back only
for `scalelab send-metrics`.

Nothing here waits on a fixed sleep or sizes a job to outlast one: the outage ends on an event (a
failed store attempt), and the job's own waits are set for each case (SCALELAB_FINISH_WAIT_S: the
first job waits at its end for the store to come back, however long the restart takes; the
writer's back-off SCALELAB_STORE_BACKOFF_S; MLflow's HTTP retries off, so the writer's own retries
are the ones that count).

.venv/bin/pytest -q tests/tracking/test_store_outage.py
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
from mlflow import MlflowClient

from helpers import BIN, free_port, log_of, record_reliability, tiny_params, wait_for, write_params
from services import SERVER_SCRIPT, serve, server_script_env

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]
LOG_EVERY = 5
STORE_FAILED = "MLflow log_batch failed"  # scalelab.tracking.writer's warning, one per failed attempt
# the outage: each refused log_batch shows at once; the writer retries for about a minute (1 s
# doubling to 16 s), and a job that reaches its end while the server is down waits for it
OUTAGE_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "SCALELAB_STORE_BACKOFF_S": "1", "SCALELAB_FINISH_WAIT_S": "300"}
# the dead store: give up at once, and spill after a short finish wait
DEAD_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "SCALELAB_STORE_BACKOFF_S": "0.05", "SCALELAB_FINISH_WAIT_S": "2"}


class RestartableServer:
    """slurm/mlflow-server.sh on one SQLite store and one fixed port, stopped and started at will."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.tmp = free_port(), tmp
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0

    @contextmanager
    def running(self):
        self.starts += 1
        env = server_script_env(f"sqlite:///{self.tmp / 'mlflow.db'}", self.tmp / "artifacts", self.port)
        with serve([str(SERVER_SCRIPT)], self.port, self.tmp / f"server-{self.starts}.log", env=env) as service:
            yield service
            os.killpg(service.proc.pid, signal.SIGKILL)  # an outage, not a graceful stop: no connection is served
            service.proc.wait()
        deadline = time.monotonic() + 10  # SIGKILLed workers close their sockets as they die
        while listening(self.port):
            assert time.monotonic() < deadline, "the server still listens"
            time.sleep(0.1)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_job(workdir: Path, prepared: Path, url: str, epochs: int, **env: str) -> subprocess.Popen:
    """`scalelab train` in the background; its stderr is a pipe, its stdout goes nowhere."""
    params = tiny_params(train={"epochs": epochs, "log_every_steps": LOG_EVERY, "checkpoint_every_steps": 200})
    write_params(workdir / "params.yaml", params)
    cmd = [str(BIN / "scalelab"), "train", "--params", "params.yaml", "--data", str(prepared), "--out", "results/train"]
    # the writer from the first checkpoint on (not after its default delay): the first metric is
    # stored while the job runs, and the outage hits the writer
    full_env = {**os.environ, "MLFLOW_TRACKING_URI": url, "SCALELAB_WRITER_AFTER_S": "0", **env}
    return subprocess.Popen(
        cmd, cwd=workdir, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def wait_for_first_metric(url: str, proc: subprocess.Popen, stderr=None, timeout_s: float = 120) -> str:
    """The job's run id, once the server holds its first train_loss (params and provenance are in)."""
    client, deadline = MlflowClient(url), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = stderr() if stderr else proc.communicate()[1]
            raise AssertionError(f"the job exited {proc.returncode} before its first metric was stored:\n{err[-4000:]}")
        for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
            if "train_loss" in run.data.metrics:
                return run.info.run_id
        time.sleep(0.2)
    raise AssertionError("no train_loss reached the server")


def histories(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("system/")]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def expected_steps(total: int, epochs: int) -> dict[str, list[int]]:
    """Each non-timing metric's steps in a run of `total` steps (training.job, training.meter)."""
    per_epoch = total // epochs
    logged = [s for s in range(1, total + 1) if s % LOG_EVERY == 0 or s == total]
    return {
        "train_loss": logged,
        "lr": logged,
        "grad_norm": logged,
        "val_loss": [per_epoch * (e + 1) for e in range(epochs)],
        "val_accuracy": [per_epoch * (e + 1) for e in range(epochs)],
        "ranks_in_sync": [total],
        "best_step": [total],
        "best_val_loss": [total],
    }


def check_complete(hist: dict[str, list[tuple[int, float]]], total: int, epochs: int, section: str) -> None:
    """Every step of every non-timing metric there once, none twice; figures to reliability.json."""
    want = expected_steps(total, epochs)
    got = {k: [s for s, _ in hist.get(k, [])] for k in want}
    sent, stored = sum(map(len, want.values())), sum(len(set(v) & set(want[k])) for k, v in got.items())
    record_reliability(section, {"metric_values_sent": sent, "metric_values_stored": stored})
    for key, steps in want.items():
        assert got[key] == steps, (key, Counter(got[key]).most_common(3), sorted(set(steps) - set(got[key]))[:10])
    for key, values in hist.items():
        assert len({s for s, _ in values}) == len(values), f"{key}: a step logged twice"


class Lines:
    """A text stream read line by line in a thread: the lines so far, and all of them at the end."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self._thread.start()

    def count(self, needle: str) -> int:
        return sum(needle in line for line in list(self.lines))

    def so_far(self) -> str:
        return "".join(list(self.lines))

    def text(self) -> str:
        self._thread.join(timeout=60)
        return "".join(self.lines)


def test_metrics_logged_while_the_server_is_down_all_arrive_once_it_is_back(workdir, prepared_digits, tmp_path):
    server, epochs = RestartableServer(tmp_path), 60
    with server.running():
        proc = start_job(workdir, prepared_digits, server.url, epochs, **OUTAGE_ENV)
        err = Lines(proc.stderr)
        run_id = wait_for_first_metric(server.url, proc, err.text)
    down = time.monotonic()  # the server is down from here: the job keeps training, its writer retrying
    job_log = log_of("the job's stderr", err.so_far)
    wait_for(lambda: err.count(STORE_FAILED), 300, "the writer's first failed store attempt", proc, log=job_log)
    with server.running():
        outage_s, failed = time.monotonic() - down, err.count(STORE_FAILED)
        assert proc.wait(timeout=600) == 0, err.text()[-4000:]
        total = json.loads((workdir / "results/train/metrics.json").read_text())["steps"]
        client = MlflowClient(server.url)
        hist = histories(client, run_id)
        assert client.get_run(run_id).info.status == "FINISHED"
    check_complete(hist, total, epochs, "server_down_mid_run")
    record_reliability("server_down_mid_run", {"outage_s": round(outage_s, 1), "failed_store_attempts": failed})
    assert not list((workdir / "results/train").glob("unsent-metrics-*")), "spilled although the store came back"


def test_metrics_a_dead_store_never_took_are_kept_in_a_file_and_send_metrics_stores_them(
    workdir, prepared_digits, tmp_path
):
    server, epochs = RestartableServer(tmp_path), 60
    with server.running():
        proc = start_job(workdir, prepared_digits, server.url, epochs, **DEAD_ENV)
        run_id = wait_for_first_metric(server.url, proc)
    _, err = proc.communicate(timeout=600)  # the server stays down to the end
    spilled = workdir / f"results/train/unsent-metrics-{run_id}.json"
    assert proc.returncode == 1, err[-4000:]
    assert f"scalelab send-metrics {spilled}" in err and "Traceback" not in err.splitlines()[-1], err[-4000:]
    assert json.loads(spilled.read_text())["status"] == "FINISHED"
    assert (workdir / "results/train/model.pt").is_file()  # the job trained; only the store was missing

    with server.running():
        env = {**os.environ, "MLFLOW_TRACKING_URI": server.url}
        sent = subprocess.run(
            [str(BIN / "scalelab"), "send-metrics", str(spilled)], cwd=workdir, env=env, capture_output=True, text=True
        )
        assert sent.returncode == 0, sent.stderr[-3000:]
        assert "set its status to FINISHED" in sent.stdout, sent.stdout
        client = MlflowClient(server.url)
        hist = histories(client, run_id)
        run = client.get_run(run_id)
        artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert run.info.status == "FINISHED" and "weights.sha256" in run.data.tags  # set at the end, while down
    assert "metrics.json" in artifacts, artifacts
    total = json.loads((workdir / "results/train/metrics.json").read_text())["steps"]
    check_complete(hist, total, epochs, "server_down_at_the_end_then_send_metrics")
    assert not spilled.exists()
