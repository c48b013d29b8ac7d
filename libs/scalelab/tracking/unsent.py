"""Metrics the store did not take: kept in a file beside the job's outputs, sent later.

When the tracking store stays unreachable at the end of a job, `MlflowTracker.finish` writes what
is left (the metrics, the run status it could not set, tags, and artifacts under
`unsent-metrics-<run>.artifacts/`) to `<outputs>/unsent-metrics-<run>.json` and raises
`UnsentMetrics` naming the file; nothing is dropped. Once the store answers:

    scalelab send-metrics results/train/unsent-metrics-<run>.json

stores those metrics (skipping any (metric, step) the run already holds), tags and artifacts, sets
the status, and removes the file. The file holds the tracking URI with its credentials masked: `send-metrics` uses
MLFLOW_TRACKING_URI (or the default store) and refuses a store other than the recorded one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.config.loader import ConfigError
from scalelab.runtime.io import atomic_write_bytes, atomic_write_json
from scalelab.tracking.secrets import mask_uri
from scalelab.tracking.writer import Row, store

PREFIX = "unsent-metrics-"
SEND_ATTEMPTS = 4  # log_batch tries per chunk when sending a file (back-off 0.5 s doubling)


@dataclass
class Unsent:
    """What the store did not take: metric rows, the status to set, tags, artifact contents."""

    metrics: list[Row] = field(default_factory=list)
    status: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # artifact path in the run -> content


class UnsentMetrics(RuntimeError):
    """The store did not take everything before the job ended; the rest is in `path`."""

    exit_status = 1  # the CLI's "failed job"

    def __init__(self, path: Path, run_id: str, left: Unsent, uri: str) -> None:
        extra = [f"its status {left.status} was not set"] if left.status else []
        extra += [f"{len(left.tags)} tags"] if left.tags else []
        extra += [f"{len(left.files)} artifacts"] if left.files else []
        super().__init__(
            f"{len(left.metrics)} metrics of run {run_id} could not be stored in {mask_uri(uri)}"
            f"{' (and ' + ', '.join(extra) + ')' if extra else ''}; they are saved in {path}: "
            f"send them with `scalelab send-metrics {path}` once the store answers"
        )
        self.path = path


def spill_path(folder: str | Path, run_id: str) -> Path:
    return Path(folder).resolve() / f"{PREFIX}{run_id}.json"


def artifacts_dir(path: Path) -> Path:
    """Where a file's artifacts are kept: `unsent-metrics-<run>.artifacts/` beside it."""
    return path.with_suffix(".artifacts")


def spill(folder: str | Path, run_id: str, uri: str, left: Unsent) -> UnsentMetrics:
    """Adds `left` to the run's file in `folder` (artifacts first, the JSON last and atomically);
    returns the error to raise. An earlier file of the same run (a failed evaluate, say) is added to."""
    path = spill_path(folder, run_id)
    old = read(path)[2] if path.exists() else Unsent()
    known = {tuple(r) for r in old.metrics}
    merged = Unsent(
        [tuple(r) for r in old.metrics] + [tuple(r) for r in left.metrics if tuple(r) not in known],
        left.status or old.status,
        {**old.tags, **left.tags},
        {**old.files, **left.files},
    )
    for name, data in left.files.items():
        atomic_write_bytes(artifacts_dir(path) / name, data)
    record = {"run_id": run_id, "tracking_uri": mask_uri(uri), "status": merged.status, "tags": merged.tags}
    record.update(artifacts=sorted(merged.files), metrics=[list(r) for r in merged.metrics])
    atomic_write_json(path, record)
    return UnsentMetrics(path, run_id, merged, uri)


def read(path: Path) -> tuple[str, str, Unsent]:
    """The file, checked: its run id, its store (credentials masked), and what is left: the status
    (or null), tags, artifacts and [key, value, timestamp_ms, step] metric rows."""
    try:
        data = json.loads(path.read_text())
        rows = [(str(k), float(v), int(ts), int(step)) for k, v, ts, step in data["metrics"]]
        if data["status"] not in (None, "FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"status {data['status']!r} is not FINISHED, FAILED, KILLED or null")
        tags = {str(k): str(v) for k, v in data.get("tags", {}).items()}
        names = [str(n) for n in data.get("artifacts", [])]
        if any(Path(n).is_absolute() or ".." in Path(n).parts for n in names):
            raise ValueError("an artifact path leaves the artifacts folder")
        files = {n: (artifacts_dir(path) / n).read_bytes() for n in names}
        return str(data["run_id"]), str(data["tracking_uri"]), Unsent(rows, data["status"], tags, files)
    except FileNotFoundError as exc:
        if exc.filename == str(path):
            raise ConfigError(f"{path}: no such file (unsent metrics files are {PREFIX}<run id>.json)") from None
        raise ConfigError(f"{path}: its artifact {exc.filename} is missing") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is not an unsent-metrics file written by scalelab ({exc})") from None


def send(path: Path, uri: str) -> str:
    """Stores the file's metrics, tags and artifacts in its run at `uri`, sets the status and
    removes the file; returns what was done, in one line. The file stays when the store fails."""
    run_id, recorded_uri, left = read(path)
    if mask_uri(uri) != recorded_uri:
        raise ConfigError(
            f"{path} holds metrics for the store {recorded_uri}, but MLFLOW_TRACKING_URI is "
            f"{mask_uri(uri)}; set MLFLOW_TRACKING_URI to the recorded store (with its credentials)"
        )
    from mlflow import MlflowClient
    from mlflow.entities import RunTag

    client = MlflowClient(uri)
    held = client.get_run(run_id).data.metrics
    stored = {(k, m.step) for k in held for m in client.get_metric_history(run_id, k)}
    rows = [r for r in left.metrics if (r[0], r[3]) not in stored]
    try:
        if rows and not store(client, run_id, rows, attempts=SEND_ATTEMPTS):
            raise RuntimeError("log_batch failed")
        if left.tags:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in sorted(left.tags.items())])
        for name in left.files:
            parent = str(Path(name).parent) if "/" in name else None
            client.log_artifact(run_id, str(artifacts_dir(path) / name), parent)
        if left.status:
            client.set_terminated(run_id, status=left.status)
    except Exception:  # what got in is skipped next time; the file stays
        raise UnsentMetrics(path, run_id, Unsent(rows, left.status, left.tags, left.files), uri) from None
    path.unlink()
    shutil.rmtree(artifacts_dir(path), ignore_errors=True)
    status_part = f", set its status to {left.status}" if left.status else ""
    there = len(left.metrics) - len(rows)
    return (
        f"stored {len(rows)} metrics, {len(left.tags)} tags and {len(left.files)} artifacts in run {run_id}"
        f"{status_part} ({there} metrics were there already); removed {path}"
    )
