"""Experiment tracking behind a small interface: a no-op tracker and the MLflow one.

The training loop only ever calls a `Tracker`. Global rank 0 holds the MLflow tracker; every other
rank holds a `NullTracker`. `log_metrics` only appends a tuple to a list, so the hot loop makes no
MLflow call. At each checkpoint the train job (scalelab.training.checkpoint_parts) calls `flush(wait=False)`,
which hands the list to a writer process (scalelab.tracking.writer) that stores it with `log_batch`
and retries on failure, and returns at once; the metrics not yet confirmed (`pending_metrics()`) go
into the checkpoint, so a job killed while the writer is busy re-sends them on resume
(`replay_metrics`; SQL stores drop the exact duplicates this can give). The writer starts only once
the run has been open WRITER_AFTER_S (SCALELAB_WRITER_AFTER_S overrides it): it costs a Python
process importing MLflow (~2 s of CPU), which a short job does not need; until then
flush(wait=False) keeps the metrics buffered, where checkpoints hold them just the same, and
finish() stores them. `flush()` (wait=True) blocks until everything is stored, in this process when
no writer runs (evaluation, the study).
`finish()` flushes, waits at most about FINISH_WAIT_S (SCALELAB_FINISH_WAIT_S overrides it; tests
shrink it) and sets the status: `training.job.run` calls it on success and on failure alike, so a
killed run ends KILLED or FAILED, never RUNNING. What the store still refuses then is written to a
file and sent later (scalelab.tracking.unsent).

Where the store is: scalelab.tracking.location.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from scalelab.tracking import unsent
from scalelab.tracking.location import (  # noqa: F401 (re-exported)
    LOCAL_FILE,
    LocalFileError,
    private_store,
    sqlite_file,
    store_init_lock,
    tracking_uri,
)
from scalelab.tracking.secrets import mask_uri
from scalelab.tracking.writer import ProcessWriter, backoff_s, seconds_from_env, store
from scalelab.tracking.writer import Row as MetricRow

log = logging.getLogger(__name__)
# MLflow 3.17 clients download an S3-backed server's artifacts straight from the store, by presigned
# URLs, whenever the server advertises it: the client must then reach the store itself (one on the
# server's loopback is out of reach), and an object stored with Content-Encoding: gzip (a profiler
# trace, *.json.gz) arrives decompressed and cut to its compressed size (MLflow 3.17.2 with rclone
# serve s3). scalelab's processes download through the server; a plain MLflow client needs the same
# setting (see the README). MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD=true opts back in. Uploads of
# files over MLFLOW_MULTIPART_UPLOAD_MINIMUM_FILE_SIZE (500 MB) would go to the store the same way.
os.environ.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD", "false")
os.environ.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_UPLOAD", "false")
PARAM_MAX_CHARS = 6000
BATCH_PARAMS = 100
FINISH_WAIT_S = 20.0  # finish() takes at most about this long (torchrun SIGKILLs 30 s after SIGTERM)
WRITER_AFTER_S = 10.0  # a run open for less than this stores its metrics at finish(), without a writer
# MLflow 3's UI opens an experiment of this kind on its runs table, not on the GenAI overview
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def finish_wait_s() -> float:
    """How long finish() may wait for the store: SCALELAB_FINISH_WAIT_S, else FINISH_WAIT_S."""
    return seconds_from_env("SCALELAB_FINISH_WAIT_S", FINISH_WAIT_S)


class Tracker:
    """The interface, and the no-op tracker used when tracking is off or rank != 0."""

    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | Path, folder: str | None = None) -> None: ...
    def log_dict(self, obj: Any, name: str) -> None: ...
    def log_text(self, text: str | bytes, name: str) -> None: ...
    def flush(self, wait: bool = True) -> None: ...
    def pending_metrics(self) -> list[MetricRow]:
        return []

    def replay_metrics(self, rows: list[MetricRow]) -> None: ...
    def skip_stored(self) -> None: ...
    def finish(self, status: str | None = "FINISHED", spill_dir: str | Path | None = None) -> None: ...


NullTracker = Tracker


class MlflowTracker(Tracker):
    """One MLflow run, opened (or resumed) by `open()`."""

    def __init__(self, client: Any, run_id: str, writer_after_s: float | None = None) -> None:
        self.client = client
        self.run_id = run_id
        self._metrics: list[MetricRow] = []  # logged, not yet handed to a writer
        self._writer: ProcessWriter | None = None  # started by the first flush(wait=False) once due
        if writer_after_s is None:
            writer_after_s = seconds_from_env("SCALELAB_WRITER_AFTER_S", WRITER_AFTER_S)
        self._writer_due = time.monotonic() + writer_after_s
        self._stored: set[tuple[str, int]] = set()  # (key, step) already in the store (a resumed run)
        self._unsent_tags: dict[str, str] = {}  # tags and artifacts the store refused: finish() spills them
        self._unsent_files: dict[str, bytes] = {}  # artifact path in the run -> content

    @classmethod
    def open(
        cls,
        experiment: str,
        *,
        run_name: str,
        tags: dict[str, Any] | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        start_ms: int | None = None,
    ) -> MlflowTracker:
        """Starts a new run (at `start_ms`, default now), or resumes `run_id` (its status goes back
        to RUNNING)."""
        from mlflow import MlflowClient

        with store_init_lock(tracking_uri()):  # MlflowClient creates an SQLite store's tables
            client = MlflowClient(tracking_uri())
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id)
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        with store_init_lock(client.tracking_uri):
            exp = experiment_id(client, experiment)
        run = client.create_run(exp, run_name=run_name, tags={k: str(v) for k, v in tags.items()}, start_time=start_ms)
        return cls(client, run.info.run_id)

    @classmethod
    def attach(cls, run_id: str) -> MlflowTracker:
        """Logs into an existing run without touching its status (e.g. evaluation)."""
        from mlflow import MlflowClient

        return cls(MlflowClient(tracking_uri()), run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:PARAM_MAX_CHARS]) for k, v in sorted(params.items())]
        for i in range(0, len(items), BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + BATCH_PARAMS])

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in sorted(tags.items())]
        for i in range(0, len(items), BATCH_PARAMS):
            try:
                self.client.log_batch(self.run_id, tags=items[i : i + BATCH_PARAMS])
            except Exception as exc:  # the store is down (after MLflow's own retries): finish() keeps them
                log.warning("tags not stored yet (%s); kept for the end of the run", mask_uri(str(exc))[:300])
                self._unsent_tags.update({t.key: t.value for t in items[i:]})
                return

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._metrics += [(k, float(v), now, step) for k, v in metrics.items() if (k, step) not in self._stored]

    def skip_stored(self) -> None:
        """Loads the (metric, step) pairs the run already holds; those are not logged again.

        A resumed job recomputes the steps after its checkpoint, which an earlier try may have
        stored already: with this, each step is stored once, with its first value.
        """
        keys = [k for k in self.client.get_run(self.run_id).data.metrics if not k.startswith("system/")]
        self._stored = {(k, m.step) for k in keys for m in self.client.get_metric_history(self.run_id, k)}

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        try:
            self.client.log_artifact(self.run_id, str(path), folder)
        except Exception as exc:  # the store is down: finish() keeps a copy
            if not Path(path).is_file():
                raise
            log.warning("artifact %s not stored yet (%s); kept for the end of the run", path, mask_uri(str(exc))[:300])
            self._unsent_files[str(Path(folder or "") / Path(path).name)] = Path(path).read_bytes()

    def log_dict(self, obj: Any, name: str) -> None:
        self.log_text(json.dumps(obj, indent=2, sort_keys=True, default=str), name)

    def log_text(self, text: str | bytes, name: str) -> None:
        """Stores `text` as the artifact `name`: UTF-8, or bytes as they are (a diff)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(name).name
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
            self.log_artifact(path, str(Path(name).parent) if Path(name).parent != Path(".") else None)

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid once a flush(wait=False) started it (for benchmarks)."""
        return self._writer.pid if self._writer is not None else None

    def flush(self, wait: bool = True, timeout_s: float | None = None) -> None:
        """Sends buffered metrics. Without `wait`, hands them to the writer process (started once
        the run has been open WRITER_AFTER_S; before that they stay buffered) and returns at once;
        with it, blocks until they are stored (or `timeout_s`, default finish_wait_s(), passes) and
        logs in this process when no writer runs."""
        timeout_s = finish_wait_s() if timeout_s is None else timeout_s
        if not wait and self._writer is None and time.monotonic() < self._writer_due:
            return
        if self._metrics and (not wait or self._writer is not None):
            if self._writer is None:
                self._writer = ProcessWriter(self.client.tracking_uri, self.run_id)
            self._writer.submit(self._metrics)
            self._metrics = []
        if not wait:
            return
        if self._writer is not None and not self._writer.drain(timeout_s):
            if self._writer.alive():
                log.warning("%d metrics not yet stored after %.0f s", len(self._writer.pending()), timeout_s)
                return
            self._metrics = self._writer.take_pending() + self._metrics  # the writer died: send here
        if self._metrics and store(self.client, self.run_id, self._metrics, attempts=1):
            self._metrics = []

    def pending_metrics(self) -> list[MetricRow]:
        """Metrics logged but not yet confirmed stored, oldest first (for checkpoints)."""
        return (self._writer.pending() if self._writer else []) + list(self._metrics)

    def replay_metrics(self, rows: list[MetricRow]) -> None:
        """Queues metrics saved by `pending_metrics()` in an earlier try, with their timestamps
        (sent with the next flush)."""
        self._metrics[:0] = [tuple(r) for r in rows if (r[0], r[3]) not in self._stored]

    def finish(
        self, status: str | None = "FINISHED", spill_dir: str | Path | None = None, end_ms: int | None = None
    ) -> None:
        """Stores what is buffered (waiting at most ~finish_wait_s() in all), then sets the status
        (None: leaves it). Metrics the store did not take, a status it could not set, and tags and
        artifacts it refused are written to `<spill_dir>/unsent-metrics-<run>.json` (default: this
        folder) and `UnsentMetrics` names that file (scalelab.tracking.unsent): nothing is dropped.

        A store that took the metrics but then refuses the rest (a server killed or restarted at
        that moment) is asked again with back-off until the finish wait is spent: a store that
        blinks at the end of a run must not fail the job."""
        wait_s = finish_wait_s()
        deadline = time.monotonic() + wait_s
        self._store_buffered(wait_s, deadline=deadline)
        unset = status
        if not self._metrics:  # the store answers (else spill at once, within the finish wait)
            unset = self._store_the_rest(status, end_ms, deadline)
        if self._metrics or unset or self._unsent_tags or self._unsent_files:
            left = unsent.Unsent(self._metrics, unset, self._unsent_tags, self._unsent_files)
            self._metrics, self._unsent_tags, self._unsent_files = [], {}, {}
            raise unsent.spill(spill_dir or Path.cwd(), self.run_id, self.client.tracking_uri, left)

    def _store_buffered(self, wait_s: float, deadline: float) -> None:
        """Everything logged, stored by the writer or here; what is left stays in `_metrics`."""
        self.flush(wait=True, timeout_s=wait_s / 2)
        if self._writer is not None:
            self._writer.close(timeout_s=2.0)
            self._metrics = self._writer.take_pending() + self._metrics
            self._writer = None
        for delay_s in (0.0, backoff_s(1), backoff_s(2), backoff_s(3)):  # 0, 1, 2, 4 s by default
            if not self._metrics or time.monotonic() + delay_s > deadline:
                break
            time.sleep(delay_s)
            if store(self.client, self.run_id, self._metrics, attempts=1):
                self._metrics = []

    def _store_the_rest(self, status: str | None, end_ms: int | None, deadline: float) -> str | None:
        """The refused tags and artifacts, then the status, tried again with back-off (`backoff_s`)
        until all are stored or the next try would pass `deadline`; returns the status if unset."""
        attempt = 0
        while True:
            self._resend_refused()
            if status is not None and self._set_status(status, end_ms):
                status = None
            if not (status or self._unsent_tags or self._unsent_files):
                return None
            delay_s = backoff_s(attempt)
            if time.monotonic() + delay_s > deadline:
                return status
            log.warning("the tracking store refused the end of run %s; trying again in %.1f s", self.run_id, delay_s)
            time.sleep(delay_s)
            attempt += 1

    def _resend_refused(self) -> None:
        """One more try at the tags and artifacts the store refused during the run."""
        tags, files, self._unsent_tags, self._unsent_files = self._unsent_tags, self._unsent_files, {}, {}
        if tags:
            self.set_tags(tags)
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                self.log_artifact(path, str(Path(name).parent) if "/" in name else None)

    def _set_status(self, status: str, end_ms: int | None = None) -> bool:
        try:
            self.client.set_terminated(self.run_id, status=status, end_time=end_ms)
            return True
        except Exception as exc:
            log.warning("could not set run %s to %s: %s", self.run_id, status, mask_uri(str(exc))[:300])
            return False


def runs_table(base_url: str, experiment: str) -> str:
    """The address of `experiment`'s runs table in the MLflow UI's model-training view (created,
    with the tag that makes the UI open it on its runs, if the store does not have it yet)."""
    from mlflow import MlflowClient

    with store_init_lock(tracking_uri()):
        client = MlflowClient(tracking_uri())
        exp = experiment_id(client, experiment)
    for key, value in EXPERIMENT_TAGS.items():  # an experiment made before the tag existed
        client.set_experiment_tag(exp, key, value)
    return f"{base_url.rstrip('/')}/#/experiments/{exp}/runs?workflowType=machine_learning"


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment `name`, created if missing (safe against a concurrent creator); with
    an SQLite store its artifacts go to `mlruns/` beside the database, not under the cwd."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    db = sqlite_file(client.tracking_uri)
    location = (db.absolute().parent / "mlruns").as_uri() if db is not None else None  # sqlite:///x.db: cwd
    try:
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
    except Exception:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
