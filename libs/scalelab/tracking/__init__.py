"""Tracking: the tracker interface and its MLflow implementation (`tracker`), where the store is
(`location`: MLFLOW_TRACKING_URI, .scalelab.local.yaml, mlflow.db), reading and closing runs
outside the training loop (`runs`), the metric writer process (`writer`), metrics kept for later
when the store is down (`unsent`), per-node system metrics (`sysmetrics`) and provenance
(`provenance`).

Owns: everything that talks to MLflow (tests/layout/test_layers.py: no module outside it imports
mlflow). The training loop sees only `Tracker`. Imports config and runtime only.
"""

from scalelab.tracking.tracker import MlflowTracker, NullTracker, Tracker, experiment_id, tracking_uri
from scalelab.tracking.unsent import UnsentMetrics

__all__ = ["MlflowTracker", "NullTracker", "Tracker", "UnsentMetrics", "experiment_id", "tracking_uri"]
