"""Reading and closing runs in the tracking store, for code outside the training loop (sweeps,
reproduce, fetch, the launcher, benchmarks): the one place besides the tracker that talks to
MLflow, so a second tracking backend replaces this module and `tracker`, nothing else.

`client()` is the store's client (the run, its params, tags, metric history and artifacts);
the functions below are the intents that several callers share.
"""

from __future__ import annotations

from typing import Any

from scalelab.tracking.location import store_init_lock, tracking_uri

OPEN = ("SCHEDULED", "RUNNING")


def client(uri: str | None = None) -> Any:
    """The tracking store's client (MLflow's), on `uri` or the project's store (`tracking_uri`).
    A new SQLite store is created its owner's alone."""
    from mlflow import MlflowClient

    uri = uri or tracking_uri()
    with store_init_lock(uri):
        return MlflowClient(uri)


def status(run_id: str, uri: str | None = None) -> str:
    """The run's status: SCHEDULED, RUNNING, FINISHED, FAILED or KILLED."""
    return client(uri).get_run(run_id).info.status


def tags(run_id: str, uri: str | None = None) -> dict[str, str]:
    return dict(client(uri).get_run(run_id).data.tags)


def end_if_open(run_id: str, status_if_open: str, uri: str | None = None) -> str:
    """Ends a run still SCHEDULED or RUNNING with `status_if_open`; returns its final status."""
    store = client(uri)
    if store.get_run(run_id).info.status in OPEN:
        store.set_terminated(run_id, status=status_if_open)
    return store.get_run(run_id).info.status


def set_tag(run_id: str, key: str, value: str, uri: str | None = None) -> None:
    client(uri).set_tag(run_id, key, value)
