"""Metrics the store did not take: the file `finish` writes, and `scalelab send-metrics`
(scalelab.tracking.unsent). On a real SQLite store, and a tracker whose server never answers.

.venv/bin/pytest -q tests/tracking/test_unsent.py
"""

import pytest
from mlflow import MlflowClient

from helpers import free_port, run_cli
from scalelab import tracking
from scalelab.config import ConfigError
from scalelab.tracking import unsent


@pytest.fixture
def sqlite_run(store_ready):
    tracker = tracking.MlflowTracker.open("t", run_name="r")
    return tracking.tracking_uri(), tracker.run_id


def rows(n, key="loss"):
    return [(key, 1.0 / s, 1_700_000_000_000 + s, s) for s in range(1, n + 1)]


def test_finish_against_a_dead_server_writes_every_metric_and_the_status_to_a_file(workdir, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("SCALELAB_STORE_BACKOFF_S", "0.01")  # finish's retries: 0.02, 0.04, 0.08 s, not 1, 2, 4
    uri = f"http://scalelab:hunter2hunter2@127.0.0.1:{free_port()}"  # nothing listens there
    tracker = tracking.MlflowTracker(MlflowClient(uri), "0123abcd")
    for step in range(1, 26):
        tracker.log_metrics({"loss": 1.0 / step, "acc": step / 25}, step)
    tracker.set_tags({"weights.sha256": "ab12"})  # kept, not raised: the run goes on
    tracker.log_text("{}", "eval/metrics.json")
    with pytest.raises(tracking.UnsentMetrics) as err:
        tracker.finish("FINISHED", spill_dir=workdir / "out")
    path = workdir / "out/unsent-metrics-0123abcd.json"
    assert err.value.path == path
    message = str(err.value)
    assert f"scalelab send-metrics {path}" in message and "50 metrics of run 0123abcd" in message, message
    assert "(and its status FINISHED was not set, 1 tags, 1 artifacts)" in message, message
    assert "hunter2" not in message
    assert "hunter2" not in path.read_text()
    _, _, saved = unsent.read(path)
    assert saved.status == "FINISHED" and saved.tags == {"weights.sha256": "ab12"}
    assert saved.files == {"eval/metrics.json": b"{}"}
    assert sorted((k, s) for k, _, _, s in saved.metrics) == sorted(
        (k, s) for s in range(1, 26) for k in ("loss", "acc")
    )


def test_a_second_spill_of_the_same_run_adds_to_the_file(workdir):
    first = unsent.spill(workdir, "r1", "sqlite:///x.db", unsent.Unsent(rows(3), None, {"a": "1"}, {"x/f.json": b"1"}))
    left = unsent.Unsent(rows(5) + rows(2, "test_accuracy"), "FAILED", {"b": "2"}, {"g.txt": b"2"})
    second = unsent.spill(workdir, "r1", "sqlite:///x.db", left)
    assert first.path == second.path
    run_id, uri, saved = unsent.read(second.path)
    assert (run_id, uri, saved.status, saved.tags) == ("r1", "sqlite:///x.db", "FAILED", {"a": "1", "b": "2"})
    assert len(saved.metrics) == 7  # 5 loss steps (3 were there) + 2
    assert saved.files == {"x/f.json": b"1", "g.txt": b"2"}


@pytest.mark.integration  # the CLI, in a process of its own
def test_send_metrics_stores_the_file_sets_the_status_and_removes_it(sqlite_run, workdir):
    uri, run_id = sqlite_run
    client = MlflowClient(uri)
    client.log_batch(run_id, metrics=[])  # the run exists and is RUNNING
    client.log_metric(run_id, "loss", 1.0, step=1)  # step 1 got through before the store went away
    left = unsent.Unsent(rows(10), "FINISHED", {"weights.sha256": "ab12"}, {"eval/metrics.json": b"{}"})
    path = unsent.spill(workdir / "results/train", run_id, uri, left).path

    got = run_cli("send-metrics", str(path), cwd=workdir)
    assert f"stored 9 metrics, 1 tags and 1 artifacts in run {run_id}, set its status to FINISHED" in got.stdout
    assert "(1 metrics were there already)" in got.stdout
    assert not path.exists() and not unsent.artifacts_dir(path).exists()
    assert client.get_run(run_id).data.tags["weights.sha256"] == "ab12"
    assert [a.path for a in client.list_artifacts(run_id, "eval")] == ["eval/metrics.json"]
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 11))  # each step once
    assert {m.step: m.value for m in history}[7] == 1.0 / 7
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.integration  # the CLI, in a process of its own
def test_send_metrics_refuses_a_file_for_another_store(sqlite_run, workdir):
    _, run_id = sqlite_run
    path = unsent.spill(workdir, run_id, "http://u:secretsecret@mlflow.lab:5000", unsent.Unsent(rows(2))).path
    got = run_cli("send-metrics", str(path), cwd=workdir, check=False)
    assert got.returncode == 2, got.stderr
    assert "http://u:***@mlflow.lab:5000" in got.stderr and "MLFLOW_TRACKING_URI" in got.stderr, got.stderr
    assert path.exists() and "Traceback" not in got.stderr


@pytest.mark.parametrize(
    "content, says",
    [
        ("", "not an unsent-metrics file"),
        ('{"run_id": "r", "tracking_uri": "x", "status": "DONE", "metrics": []}', "status 'DONE'"),
        ('{"run_id": "r", "tracking_uri": "x", "status": null, "metrics": [["loss", "x", 1, 2]]}', "could not convert"),
        ('{"run_id": "r", "status": null, "metrics": []}', "tracking_uri"),
        ('{"run_id": "r", "tracking_uri": "x", "status": null, "metrics": [], "artifacts": ["../a"]}', "leaves"),
        ('{"run_id": "r", "tracking_uri": "x", "status": null, "metrics": [], "artifacts": ["a"]}', "is missing"),
    ],
)
def test_a_bad_file_is_refused_naming_it(tmp_path, content, says):
    path = tmp_path / "unsent-metrics-r.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=says) as err:
        unsent.read(path)
    assert str(path) in str(err.value)


def test_a_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        unsent.read(tmp_path / "nope.json")


@pytest.mark.integration  # the CLI, in a process of its own
def test_evaluate_against_a_dead_store_keeps_test_accuracy_in_a_file_and_exits_1(workdir, prepared_digits):
    import torch

    from helpers import tiny_params, write_params
    from scalelab.training import workloads

    params = write_params(workdir / "params.yaml", tiny_params())
    train = yaml_train(params)
    wl = workloads.load(train["workload"], train["model"], input_shape=[1, 8, 8], num_classes=10)
    (workdir / "train").mkdir()
    blob = {"model": wl.model.state_dict(), "workload": train["workload"], "model_config": train["model"]}
    torch.save({**blob, "input_shape": [1, 8, 8], "num_classes": 10}, workdir / "train/model.pt")
    (workdir / "train/run.json").write_text('{"run_id": "feed0123"}')
    env = {
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "SCALELAB_STORE_BACKOFF_S": "0.01",
    }
    args = ("evaluate", "--data", str(prepared_digits), "--train", "train", "--out", "eval/metrics.json")
    proc = run_cli(*args, cwd=workdir, env=env, check=False)
    path = workdir / "eval/unsent-metrics-feed0123.json"
    assert proc.returncode == 1, proc.stderr
    assert f"scalelab send-metrics {path}" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    _, _, saved = unsent.read(path)
    assert {k for k, *_ in saved.metrics} == {"test_loss", "test_accuracy"} and saved.status is None
    assert (workdir / "eval/metrics.json").is_file()


def yaml_train(path):
    import yaml

    return yaml.safe_load(path.read_text())["train"]
