"""The real pipeline: `dvc repro` in a committed copy of the repo, MLflow read back from mlflow.db.

The default pipeline is built once per session (conftest.trained_pipeline) and shared with
tests/tracking/test_provenance.py; a test that reruns stages works on a copy of it."""

import json
import shutil

import pytest
import yaml
from mlflow import MlflowClient

from helpers import run_cli, write_params

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def only_train_run(repo):
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scalelab")
    runs = client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'train'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def test_dvc_repro_end_to_end(trained_pipeline):
    # the study has its own test; this one checks the training path with the default params
    repo = trained_pipeline  # shared: read it only (conftest.trained_pipeline)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    metrics = json.loads((repo / "results/eval/metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.95, metrics  # the default digits workload

    run = only_train_run(repo)
    assert run.info.status == "FINISHED" and run.info.run_name == "ddp-w2-fp32-seed0"
    assert run.data.params["train.lr"] == str(params["train"]["lr"])
    assert run.data.params["data.source"] == "digits"
    assert {k for k in run.data.params if k.startswith("seed.rank.")} == {"seed.rank.0", "seed.rank.1"}
    # training_pipeline rewrote params.yaml and dvc.yaml without committing them
    assert len(run.data.tags["git.commit"]) == 40 and run.data.tags["git.dirty"] == "true"
    experiment = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}").get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on runs
    for key in ("samples_per_s", "step_time_ms", "train_loss", "val_accuracy", "test_accuracy", "test_loss"):
        assert key in run.data.metrics, key
    assert run.data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    artifacts = {a.path for a in MlflowClient(f"sqlite:///{repo / 'mlflow.db'}").list_artifacts(run.info.run_id)}
    assert {"config.json", "seeds.json"} <= artifacts


def test_dvc_reruns_nothing_then_only_the_stages_a_param_change_reaches(trained_pipeline, tmp_path):
    repo = tmp_path / "repo"  # a copy: this test reruns stages
    shutil.copytree(trained_pipeline, repo, symlinks=True)
    store = tmp_path / "mlflow.db"  # the copy's mlflow.db points at the shared pipeline's artifacts
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    assert "test_accuracy" in run_cli("dvc", "metrics", "show", cwd=repo, env=env).stdout
    again = run_cli("dvc", "repro", cwd=repo, env=env).stdout
    assert "Data and pipelines are up to date" in again
    assert not store.exists()  # nothing ran, nothing was tracked

    trained_steps = json.loads((repo / "results/train/metrics.json").read_text())["steps"]  # default epochs
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["epochs"] = 1  # a train param prepare does not read (and a cheap rerun: not 30 epochs)
    write_params(repo / "params.yaml", params)
    out = run_cli("dvc", "repro", cwd=repo, env=env).stdout
    assert "Running stage 'train'" in out and "Running stage 'evaluate'" in out
    assert "Running stage 'prepare'" not in out
    assert 0 < json.loads((repo / "results/train/metrics.json").read_text())["steps"] < trained_steps  # retrained
