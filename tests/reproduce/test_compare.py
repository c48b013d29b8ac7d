"""reproduce's comparisons on two real runs in a SQLite store: a changed metric value (one ulp),
a missing step, a changed param or seed and changed weights are each a MISMATCH; timing is skipped."""

import math
import shutil

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from scalelab import tracking
from scalelab.reproduce.compare import compare_metrics, compare_params, compare_weights

LOSS = [(s, 1.0 / s) for s in range(5, 31, 5)]


@pytest.fixture(scope="module")
def client(tmp_path_factory, mlflow_schema):
    """One SQLite store for the module (a copy of an empty one: no migrations); each test makes its
    own runs in it and compares only those."""
    path = tmp_path_factory.mktemp("compare") / "mlflow.db"
    shutil.copy(mlflow_schema, path)
    return MlflowClient(f"sqlite:///{path}")


def make_run(client, loss=LOSS, params=None, sha="ab" * 32, step_ms=7.0):
    exp = tracking.experiment_id(client, "compare")
    run_id = client.create_run(exp).info.run_id
    metrics = [Metric("train_loss", v, 1000 + s, s) for s, v in loss] + [Metric("step_time_ms", step_ms, 1, 30)]
    params = params or {"train.lr": "0.1", "seed.rank.0": "123"}
    tags = [RunTag("weights.sha256", sha)]
    client.log_batch(run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()], tags=tags)
    return client.get_run(run_id)


def statuses(checks):
    return {c.name.split(" (")[0]: c.status for c in checks}


def test_an_identical_run_matches_and_timing_is_skipped(client):
    old, new = make_run(client), make_run(client, step_ms=9.5)
    got = statuses(compare_metrics(client, old, new, 0, 0))
    assert got == {"metric step_time_ms": "skipped: timing/system", "metric train_loss": "match"}
    assert statuses(compare_params(old, new)) == {"params": "match"}
    assert compare_weights(old, new, on_gpu=False).status == "match"


@pytest.mark.parametrize(
    "loss",
    [
        [(s, math.nextafter(v, 2.0) if s == 15 else v) for s, v in LOSS],  # one ulp at one step
        LOSS[:-1],  # the last step missing
        [*LOSS, (35, 0.01)],  # one step more
    ],
    ids=["one-ulp", "missing-step", "extra-step"],
)
def test_a_changed_metric_history_is_a_mismatch(client, loss):
    old, new = make_run(client), make_run(client, loss=loss)
    assert statuses(compare_metrics(client, old, new, 0, 0))["metric train_loss"] == "MISMATCH"


def test_a_changed_param_or_seed_is_a_mismatch_naming_it(client):
    old = make_run(client)
    new = make_run(client, params={"train.lr": "0.1", "seed.rank.0": "124"})
    got = statuses(compare_params(old, new))
    assert got == {"param seed.rank.0": "MISMATCH", "params": "MISMATCH"}


def test_changed_weights_are_a_mismatch_on_cpu_and_compared_by_metrics_on_gpu(client):
    old, new = make_run(client), make_run(client, sha="cd" * 32)
    assert compare_weights(old, new, on_gpu=False).status == "MISMATCH"
    assert compare_weights(old, new, on_gpu=True).status.startswith("skipped")
