"""The MLflow tracker on a real SQLite store: batching, the writer process, flush on failure."""

import os
import time
from unittest.mock import ANY

import pytest
from mlflow import MlflowClient

from helpers import tiny_params, train_here, write_params
from scalelab import tracking
from scalelab.config import load_params
from scalelab.runtime.signals import Terminated


@pytest.fixture
def store(store_ready, monkeypatch):
    # the store answers: flush and finish wait for the writer (a niced process, slow to start on a
    # busy machine) until it has stored everything, not for the default 20 s
    monkeypatch.setenv("SCALELAB_FINISH_WAIT_S", "600")
    monkeypatch.setenv("SCALELAB_WRITER_AFTER_S", "0")  # the writer from the first flush(wait=False)
    return MlflowClient(tracking.tracking_uri())


def history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_finish_flushes_the_buffer_and_sets_the_status(store):
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    for step in range(1, 31):
        tracker.log_metrics({"loss": 1.0 / step}, step)
    assert history(store, tracker.run_id, "loss") == []  # nothing sent before a flush
    tracker.finish("FAILED")
    run = store.get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert [s for s, _ in history(store, tracker.run_id, "loss")] == list(range(1, 31))


@pytest.mark.integration  # the writer process (python, mlflow, niced)
def test_async_flush_goes_through_the_writer_and_replay_adds_no_duplicates(store):
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    for step in range(1, 11):
        tracker.log_metrics({"loss": float(step), "acc": 0.5}, step)
    pending = tracker.pending_metrics()  # what a checkpoint taken now would hold: all 20, none stored
    assert len(pending) == 20
    tracker.flush(wait=False)
    tracker.flush(wait=True)
    assert tracker.pending_metrics() == []
    tracker.replay_metrics(pending)  # what a resumed job does with a checkpoint's pending metrics
    tracker.finish()
    assert [s for s, _ in history(store, tracker.run_id, "loss")] == list(range(1, 11))
    assert len(history(store, tracker.run_id, "acc")) == 10
    assert store.get_run(tracker.run_id).info.status == "FINISHED"


@pytest.mark.integration  # the writer process, once due
def test_a_run_shorter_than_the_writer_delay_stores_its_metrics_at_finish_without_a_writer(store):
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    tracker._writer_due = time.monotonic() + 600  # as if SCALELAB_WRITER_AFTER_S were 600
    tracker.log_metrics({"loss": 1.0}, 1)
    tracker.flush(wait=False)  # a checkpoint's flush, before the writer is due
    assert tracker.writer_pid is None and tracker.pending_metrics() == [("loss", 1.0, ANY, 1)]
    tracker.replay_metrics([("loss", 0.5, 1, 0)])  # a resumed job's: sent before what it logs itself
    assert [row[3] for row in tracker.pending_metrics()] == [0, 1]
    tracker._writer_due = time.monotonic()  # due: the next flush starts the writer
    tracker.log_metrics({"loss": 2.0}, 2)
    tracker.flush(wait=False)
    assert tracker.writer_pid is not None
    tracker.finish()
    assert history(store, tracker.run_id, "loss") == [(0, 0.5), (1, 1.0), (2, 2.0)]


@pytest.mark.integration  # the writer process (python, mlflow, niced)
def test_metrics_survive_a_dead_writer(store):
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    tracker.log_metrics({"loss": 1.0}, 1)
    tracker.flush(wait=False)
    tracker._writer._proc.kill()  # the writer process dies before storing anything
    tracker._writer._proc.wait()
    tracker.log_metrics({"loss": 2.0}, 2)
    tracker.finish("KILLED")
    assert history(store, tracker.run_id, "loss") == [(1, 1.0), (2, 2.0)]
    assert store.get_run(tracker.run_id).info.status == "KILLED"


@pytest.mark.parametrize("error, status", [(Terminated(143), "KILLED"), (RuntimeError("boom"), "FAILED")])
def test_run_ending_in_an_exception_is_flushed_and_marked(
    workdir, store_ready, prepared_digits, monkeypatch, error, status
):
    write_params(
        workdir / "p.yaml",
        tiny_params(
            train={
                "strategy": "single",
                "nproc_per_node": 1,
                "epochs": 3,
                "log_every_steps": 1,
                "checkpoint_every_steps": 1000,
            },
            tracking={"system_metrics_interval_s": 0},
        ),
    )
    params = load_params(workdir / "p.yaml")

    def evaluate(*args, **kwargs):  # the end of epoch 1: well past the last flush (none so far)
        raise error

    monkeypatch.setattr("scalelab.training.callbacks.evaluate", evaluate)
    with pytest.raises(type(error)):
        train_here(params, prepared_digits, workdir / "out")
    client = MlflowClient(tracking.tracking_uri())
    run = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])[0]
    assert run.info.status == status
    steps = [s for s, _ in history(client, run.info.run_id, "train_loss")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 10, steps  # every step up to the error


class Outage:
    """The tracker's MlflowClient behind a server that is down for its next `calls` calls (each
    refused as MLflow reports a refused connection), then back."""

    def __init__(self, client, calls):
        self.client, self.left, self.refused = client, calls, []

    def __getattr__(self, name):
        from mlflow.exceptions import MlflowException

        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.left:
                self.left -= 1
                self.refused.append(name)
                raise MlflowException(f"API request to .../{name} failed with exception ConnectionError: refused")
            return attr(*args, **kwargs)

        return call


def test_a_store_that_goes_down_after_the_last_metrics_and_comes_back_gets_the_status(store, monkeypatch, tmp_path):
    # the job's end when the server is killed (or restarted) just after its last metrics were
    # stored: the tags, then the status are refused; the job waits for the store (the finish wait,
    # here 600 s), does not spill them and exit 1
    monkeypatch.setenv("SCALELAB_STORE_BACKOFF_S", "0.01")
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    for step in range(1, 11):
        tracker.log_metrics({"loss": 1.0 / step}, step)
    tracker.flush()  # every metric stored
    tracker.client = outage = Outage(tracker.client, calls=4)
    tracker.set_tags({"weights.sha256": "ab12"})  # refused: kept for finish (outputs.write_outputs does this)
    tracker.finish("FINISHED", spill_dir=tmp_path / "out")  # no UnsentMetrics
    assert outage.refused == ["log_batch", "log_batch", "set_terminated", "log_batch"], outage.refused
    run = store.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["weights.sha256"] == "ab12"
    assert [s for s, _ in history(store, tracker.run_id, "loss")] == list(range(1, 11))
    assert not (tmp_path / "out").exists(), "spilled although the store came back within the finish wait"


def test_a_store_that_stays_down_after_the_last_metrics_gets_the_status_from_the_file(store, monkeypatch, tmp_path):
    # the same, but the store stays down for the whole finish wait: the status and tags are spilled
    monkeypatch.setenv("SCALELAB_STORE_BACKOFF_S", "0.01")
    monkeypatch.setenv("SCALELAB_FINISH_WAIT_S", "0.5")
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    tracker.log_metrics({"loss": 1.0}, 1)
    tracker.flush()
    tracker.client = Outage(tracker.client, calls=10_000)
    tracker.set_tags({"weights.sha256": "ab12"})
    with pytest.raises(tracking.UnsentMetrics, match="its status FINISHED was not set, 1 tags"):
        tracker.finish("FINISHED", spill_dir=tmp_path / "out")  # once the finish wait is spent
    assert store.get_run(tracker.run_id).info.status == "RUNNING"
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"unsent-metrics-{tracker.run_id}.json"]


def test_the_finish_wait_and_the_store_back_off_are_settable_and_checked(monkeypatch):
    from scalelab.tracking.tracker import FINISH_WAIT_S, finish_wait_s
    from scalelab.tracking.writer import backoff_s

    assert (finish_wait_s(), [backoff_s(a) for a in range(7)]) == (FINISH_WAIT_S, [0.5, 1, 2, 4, 8, 8, 8])
    monkeypatch.setenv("SCALELAB_FINISH_WAIT_S", "1.5")
    monkeypatch.setenv("SCALELAB_STORE_BACKOFF_S", "0.01")
    assert (finish_wait_s(), backoff_s(0), backoff_s(9)) == (1.5, 0.01, 0.16)
    for bad in ("-1", "soon", "inf", "nan"):
        monkeypatch.setenv("SCALELAB_FINISH_WAIT_S", bad)
        with pytest.raises(ValueError, match=f"SCALELAB_FINISH_WAIT_S='{bad}' is not allowed: must be a number"):
            finish_wait_s()


def test_a_relative_sqlite_uri_keeps_the_artifacts_beside_its_database(store_ready):
    client = MlflowClient("sqlite:///mlflow.db")  # relative to the working folder, as MLflow reads it
    exp = client.get_experiment(tracking.experiment_id(client, "relative"))
    assert exp.artifact_location == (store_ready / "mlruns").as_uri()


def test_a_new_sqlite_store_is_its_owners_alone_whatever_the_umask(workdir):
    import stat

    old = os.umask(0o002)  # group-writable, world-readable by default
    try:
        tracker = tracking.MlflowTracker.open("t", run_name="r")
        tracker.finish("FINISHED")
    finally:
        os.umask(old)
    assert stat.S_IMODE((workdir / "mlflow.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((workdir / "mlruns").stat().st_mode) == 0o700
