"""System metrics: one monitor per node (local rank 0), labelled by node, into the job's run."""

import socket

from mlflow import MlflowClient

from scalelab import tracking
from scalelab.runtime import dist
from scalelab.tracking import sysmetrics


def test_only_local_rank_zero_of_a_tracked_job_monitors(workdir):
    assert sysmetrics.start(None, dist.DistEnv(), 1.0).monitor is None  # tracking off
    assert sysmetrics.start("abc", dist.DistEnv(rank=3, local_rank=1, world_size=4), 1.0).monitor is None
    assert sysmetrics.start("abc", dist.DistEnv(), 0.0).monitor is None  # switched off


def test_monitor_logs_into_the_run_under_the_node_name(workdir, store_ready, monkeypatch):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_NODE_ID", raising=False)
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    # a node that is not global rank 0: it attaches to the broadcast run id, creates no run
    monitor = sysmetrics.start(tracker.run_id, dist.DistEnv(rank=2, local_rank=0, world_size=4), 600.0)
    assert monitor.monitor is not None
    monitor.stop()  # long before the first interval: stop() still logs one sample
    monitor.stop()  # a second stop is harmless
    tracker.finish()
    client = MlflowClient(tracking.tracking_uri())
    assert len(client.search_runs([client.get_experiment_by_name("t").experiment_id])) == 1
    metrics = client.get_run(tracker.run_id).data.metrics
    host = socket.gethostname()
    for name in ("cpu_utilization_percentage", "system_memory_usage_megabytes"):
        assert f"system/{host}/{name}" in metrics, sorted(metrics)
