"""No metric is dropped when the tracking server goes away: a 2-process DDP job against a real
`mlflow server` (slurm/mlflow-server.sh on SQLite) that dies (SIGKILL) mid-run and is started
again once the job's metric writer has failed to store, or that dies for good and comes back only
for `scalelab send-metrics`.

Nothing here waits on a fixed sleep or sizes a job to outlast one: the outage starts and ends on
events, and the job's own waits are set for each case (SCALELAB_FINISH_WAIT_S: the first job waits
at its end for the store to come back, however long the restart takes; the writer's back-off
SCALELAB_STORE_BACKOFF_S; MLflow's HTTP retries off, so the writer's own retries are the ones that
count). "Mid-run" is made so, not hoped for: the job's first metrics reach the server only once
its writer process has imported MLflow (seconds of CPU, at nice 10), by which time a free-running
job of 1,140 steps may have ended; a server killed then, after the last metrics, refused only the
run's status (CI once failed so: the job spilled and exited 1, with no failed store attempt for
the test to wait for). So the ranks are held (SIGSTOP) from the first checkpoint until the
server holds the first metrics, and go on only once the server is gone. The job's end under an
outage is tested in test_tracker.py.

.venv/bin/pytest -q tests/tracking/test_store_outage.py
"""

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from helpers import (
    BIN,
    free_port,
    log_of,
    output_tail,
    process_tree,
    record_reliability,
    says_why,
    signal_all,
    tiny_params,
    wait_for,
    write_params,
)
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

    @property
    def logs(self) -> list[Path]:
        """The log of each start so far."""
        return [self.tmp / f"server-{n}.log" for n in range(1, self.starts + 1)]

    def log_tails(self) -> str:
        """A log source: the end of each start's log (those of later starts too, once there)."""
        return "".join(output_tail(path, 2000) for path in self.logs)

    @contextmanager
    def running(self):
        self.starts += 1
        env = server_script_env(
            f"sqlite:///{self.tmp / 'mlflow.db'}", self.tmp / "artifacts", self.port, ALLOW_NO_AUTH="1"
        )
        with serve([str(SERVER_SCRIPT)], self.port, self.logs[-1], env=env) as service:
            yield service
            os.killpg(service.proc.pid, signal.SIGKILL)  # an outage, not a graceful stop: no connection is served
            service.proc.wait()
        # SIGKILLed workers close their sockets as they die
        wait_for(lambda: not listening(self.port), 10, "the killed server to stop listening", log=self.logs[-1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_job(workdir: Path, prepared: Path, url: str, epochs: int, **env: str) -> subprocess.Popen:
    """`scalelab train` in the background; its stderr is a pipe (read it with `Lines`), its
    stdout goes nowhere (the job prints nothing there)."""
    params = tiny_params(train={"epochs": epochs, "log_every_steps": LOG_EVERY, "checkpoint_every_steps": 200})
    write_params(workdir / "params.yaml", params)
    cmd = [str(BIN / "scalelab"), "train", "--params", "params.yaml", "--data", str(prepared), "--out", "results/train"]
    # the writer from the first checkpoint on (not after its default delay): the first metric is
    # stored while the job runs, and the outage hits the writer
    full_env = {**os.environ, "MLFLOW_TRACKING_URI": url, "SCALELAB_WRITER_AFTER_S": "0", **env}
    return subprocess.Popen(
        cmd, cwd=workdir, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def first_metric(url: str):
    """A predicate: the job's run id once the server holds its first train_loss (params and
    provenance are in), else None."""
    client = MlflowClient(url)

    def run_with_train_loss() -> str | None:
        for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
            if "train_loss" in run.data.metrics:
                return run.info.run_id
        return None

    return run_with_train_loss


def wait_for_first_metric(url: str, proc: subprocess.Popen, logs: list, timeout_s: float = 120) -> str:
    """The job's run id, once the server holds its first train_loss."""
    return wait_for(
        first_metric(url), timeout_s, "the job's first train_loss on the server", proc, log=logs, poll_s=0.2
    )


def job_processes(proc: subprocess.Popen, what: str) -> list[psutil.Process]:
    """The job's processes whose command line holds `what` ("train-worker": the ranks;
    "scalelab.tracking.writer": the metric writer)."""
    found = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if what in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def unread_bytes(pid: int) -> int:
    """Bytes written to process `pid`'s stdin pipe and not yet read (FIONREAD on the pipe, opened
    anew through /proc, which reads nothing from it)."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    finally:
        os.close(fd)


def hold_at_first_checkpoint(workdir: Path, url: str, proc: subprocess.Popen, logs: list) -> list[psutil.Process]:
    """SIGSTOPs the job's two ranks at its first checkpoint (within a few steps of it) until the
    server holds the metrics that checkpoint handed to the metric writer (a process of its own, not
    stopped). Until that batch is in the writer's stdin (it reads it only once it has imported
    MLflow), the ranks run in 20 ms slices: a time slice for rank 0's feeder thread, not a wait for
    an outcome. Returns the stopped ranks (resume them)."""
    ranks = wait_for(lambda: len(r := job_processes(proc, "train-worker")) == 2 and r, 300, "two ranks", proc, log=logs)
    ckpts = workdir / "results/train/checkpoints"
    wait_for(lambda: list(ckpts.glob("step-*")), 300, "the first checkpoint", proc, log=logs, poll_s=0.01)
    for rank in ranks:
        rank.suspend()
    try:
        # the writer starts at the first checkpoint's flush (SCALELAB_WRITER_AFTER_S=0)
        [writer] = wait_for(lambda: job_processes(proc, "scalelab.tracking.writer"), 60, "the writer", proc, log=logs)
        stored = first_metric(url)

        def sliced() -> bool:  # one 20 ms slice for the ranks, then: is the batch in the writer's stdin?
            for rank in ranks:
                rank.resume()
            time.sleep(0.02)  # the ranks' slice, not a wait for an outcome
            for rank in ranks:
                rank.suspend()
            return bool(unread_bytes(writer.pid) or stored())

        if not (unread_bytes(writer.pid) or stored()):
            wait_for(sliced, 300, "the first metrics in the writer's stdin", proc, log=logs, poll_s=0)
        wait_for(stored, 120, "the job's first train_loss on the server", proc, log=logs, poll_s=0.2)
    except BaseException:
        resume(ranks)
        raise
    return ranks


def resume(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.resume()
        except psutil.NoSuchProcess:
            continue


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

    def text(self, timeout_s: float = 60) -> str:
        self._thread.join(timeout=timeout_s)
        return "".join(self.lines)

    def log(self, proc: subprocess.Popen):
        """A log source for a failure message: the lines so far, all of them once `proc` has ended."""
        return log_of("the job's stderr", lambda: self.text(timeout_s=10) if proc.poll() is not None else self.so_far())


def test_metrics_logged_while_the_server_is_down_all_arrive_once_it_is_back(workdir, prepared_digits, tmp_path):
    server, epochs = RestartableServer(tmp_path), 60
    proc, ranks = None, []
    try:
        with server.running():
            proc = start_job(workdir, prepared_digits, server.url, epochs, **OUTAGE_ENV)
            err = Lines(proc.stderr)
            logs = [err.log(proc), log_of("the server's logs", server.log_tails)]
            with says_why(logs):
                ranks = hold_at_first_checkpoint(workdir, server.url, proc, logs)
                run_id = first_metric(server.url)()
        # the server is down from here (killed while the ranks are held): the job trains on from
        # its first checkpoint, its writer retrying
        with says_why(logs):
            held_at = max(int(p.stem.split("-")[1]) for p in (workdir / "results/train/checkpoints").glob("step-*"))
            resume(ranks)
            down = time.monotonic()
            wait_for(lambda: err.count(STORE_FAILED), 300, "the writer's first failed store attempt", proc, log=logs)
            with server.running():
                outage_s, failed = time.monotonic() - down, err.count(STORE_FAILED)
                assert proc.wait(timeout=600) == 0
                total = json.loads((workdir / "results/train/metrics.json").read_text())["steps"]
                client = MlflowClient(server.url)
                hist = histories(client, run_id)
                assert client.get_run(run_id).info.status == "FINISHED"
            assert held_at < total, (held_at, total)  # the steps after it were logged while the server was down
            check_complete(hist, total, epochs, "server_down_mid_run")
    finally:
        resume(ranks)
        if proc is not None and proc.poll() is None:  # a failed check: leave no job behind
            signal_all(process_tree(proc.pid), signal.SIGKILL)
    record_reliability(
        "server_down_mid_run",
        {"outage_s": round(outage_s, 1), "failed_store_attempts": failed, "outage_from_step": held_at},
    )
    assert not list((workdir / "results/train").glob("unsent-metrics-*")), "spilled although the store came back"


def test_metrics_a_dead_store_never_took_are_kept_in_a_file_and_send_metrics_stores_them(
    workdir, prepared_digits, tmp_path
):
    server, epochs = RestartableServer(tmp_path), 60
    with server.running():
        proc = start_job(workdir, prepared_digits, server.url, epochs, **DEAD_ENV)
        lines = Lines(proc.stderr)
        logs = [lines.log(proc), log_of("the server's logs", server.log_tails)]
        run_id = wait_for_first_metric(server.url, proc, logs)
    with says_why(logs):
        proc.wait(timeout=600)  # the server stays down to the end
        err = lines.text()
        spilled = workdir / f"results/train/unsent-metrics-{run_id}.json"
        assert proc.returncode == 1
        assert f"scalelab send-metrics {spilled}" in err and "Traceback" not in err.splitlines()[-1]
        assert json.loads(spilled.read_text())["status"] == "FINISHED"
        assert (workdir / "results/train/model.pt").is_file()  # the job trained; only the store was missing

        with server.running():
            env = {**os.environ, "MLFLOW_TRACKING_URI": server.url}
            sent = subprocess.run(
                [str(BIN / "scalelab"), "send-metrics", str(spilled)],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
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
