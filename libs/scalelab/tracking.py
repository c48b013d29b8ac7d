"""Experiment tracking behind a small interface: a no-op tracker and the MLflow one.

The training loop only ever calls a `Tracker`. Global rank 0 holds the MLflow tracker; every other
rank holds a `NullTracker`. Metrics are buffered in memory and sent with one `log_batch` call per
flush (the engine flushes at each checkpoint and at the end), so the hot loop makes no MLflow call.
A failed flush keeps the metrics buffered and retries at the next flush.

The store is `MLFLOW_TRACKING_URI` when set, else `mlflow.db` (SQLite) at the repository root.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
PARAM_MAX_CHARS = 6000
BATCH_METRICS = 1000  # MLflow's limit per log_batch call
BATCH_PARAMS = 100


def repo_root(start: str | Path | None = None) -> Path:
    """The nearest folder above `start` (default: cwd) that holds dvc.yaml; else cwd."""
    here = Path(start or os.getcwd()).resolve()
    return next((p for p in (here, *here.parents) if (p / "dvc.yaml").is_file()), here)


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else an absolute sqlite URI for mlflow.db at the repository root."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


class Tracker:
    """The interface, and the no-op tracker used when tracking is off or rank != 0."""

    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | Path, folder: str | None = None) -> None: ...
    def log_dict(self, obj: Any, name: str) -> None: ...
    def log_text(self, text: str, name: str) -> None: ...
    def flush(self) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...


NullTracker = Tracker


class MlflowTracker(Tracker):
    """One MLflow run, opened (or resumed) by `open()`."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self._metrics: list[Any] = []

    @classmethod
    def open(cls, experiment: str, *, run_name: str, tags: dict[str, Any] | None = None,
             run_id: str | None = None, parent_run_id: str | None = None) -> "MlflowTracker":
        """Starts a new run, or resumes `run_id` (its status goes back to RUNNING)."""
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri())
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id)
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(experiment_id(client, experiment), run_name=run_name,
                                tags={k: str(v) for k, v in tags.items()})
        return cls(client, run.info.run_id)

    @classmethod
    def attach(cls, run_id: str) -> "MlflowTracker":
        """Logs into an existing run without touching its status (e.g. evaluation)."""
        from mlflow import MlflowClient

        return cls(MlflowClient(tracking_uri()), run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:PARAM_MAX_CHARS]) for k, v in sorted(params.items())]
        for i in range(0, len(items), BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i:i + BATCH_PARAMS])

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._metrics += [Metric(k, float(v), now, step) for k, v in metrics.items()]

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), folder)

    def log_dict(self, obj: Any, name: str) -> None:
        self.log_text(json.dumps(obj, indent=2, sort_keys=True, default=str), name)

    def log_text(self, text: str, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(name).name
            path.write_text(text)
            self.log_artifact(path, str(Path(name).parent) if Path(name).parent != Path(".") else None)

    def flush(self) -> None:
        """Sends buffered metrics; on failure keeps them for the next flush."""
        while self._metrics:
            chunk = self._metrics[:BATCH_METRICS]
            try:
                self.client.log_batch(self.run_id, metrics=chunk)
            except Exception as exc:  # the server may be briefly down: retry at the next flush
                log.warning("MLflow log_batch failed (%s); %d metrics kept for retry", exc, len(self._metrics))
                return
            del self._metrics[:len(chunk)]

    def finish(self, status: str = "FINISHED") -> None:
        for delay_s in (0, 1, 2, 4, 8):
            time.sleep(delay_s)
            self.flush()
            if not self._metrics:
                break
        self.client.set_terminated(self.run_id, status=status)


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment `name`, created if missing (safe against a concurrent creator)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
