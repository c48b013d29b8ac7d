"""System metrics while training: CPU, memory, disk, network and GPU (where present), per node.

Local rank 0 of every node runs one MLflow `SystemMetricsMonitor` (a daemon thread) that logs into
the job's run: global rank 0 opens the run and broadcasts its id, and no other rank creates a run.
Each node's metrics are labelled with its node id, the host name unless
`MLFLOW_SYSTEM_METRICS_NODE_ID` is set, e.g. `system/<host>/cpu_utilization_percentage`.
GPU metrics need NVIDIA's `pynvml` (package nvidia-ml-py); without it they are left out.

The sampling interval is `tracking.system_metrics_interval_s` (0 turns the monitor off; MLflow's
MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it). One last sample is always logged when the
monitor stops, so even a run shorter than the interval has one point per node.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from scalelab.runtime import dist
from scalelab.tracking.tracker import tracking_uri

log = logging.getLogger(__name__)


class NodeMonitor:
    """Wraps a started SystemMetricsMonitor; `stop()` ends it and logs its last sample."""

    def __init__(self, monitor: Any | None) -> None:
        self.monitor = monitor

    def stop(self) -> None:
        """Stops the thread, logs one final sample and flushes; safe to call twice."""
        monitor, self.monitor = self.monitor, None
        if monitor is None:
            return
        try:
            monitor.finish()
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()
        except Exception as exc:  # system metrics must never fail a training job
            log.warning("system metrics: the last sample was not logged (%s)", exc)


def node_id() -> str:
    """The label of this node's system metrics: the host name."""
    return socket.gethostname()


def start(run_id: str | None, env: dist.DistEnv, interval_s: float) -> NodeMonitor:
    """Starts this node's monitor on local rank 0 when there is a run; else a no-op monitor.

    Args:
        run_id: the job's MLflow run (broadcast by global rank 0); None when tracking is off.
        env: this process's place in the job.
        interval_s: seconds between samples; 0 turns system metrics off.

    Returns:
        A NodeMonitor; call `stop()` before the run is finished.
    """
    if run_id is None or env.local_rank != 0 or interval_s <= 0:
        return NodeMonitor(None)
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(
            run_id, sampling_interval=interval_s, resume_logging=True, node_id=node_id(), tracking_uri=tracking_uri()
        )
        monitor.start()
    except Exception as exc:  # e.g. psutil missing: train without system metrics
        log.warning("system metrics are off on this node: %s", exc)
        return NodeMonitor(None)
    return NodeMonitor(monitor)
