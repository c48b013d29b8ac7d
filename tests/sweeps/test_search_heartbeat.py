"""A search trial whose worker died stops beating: after the timeout the next claim marks it failed
(`lost`), closes its MLflow run FAILED, and asks a replacement within the budget."""

import os
import time

import optuna
import pytest
from mlflow import MlflowClient

from helpers import tiny_params
from scalelab.sweeps import manifest
from scalelab.sweeps.search_worker import claim
from scalelab.training.pruning import load_study, open_storage

pytestmark = pytest.mark.integration


def a_search(workdir, data, trials):
    folder = workdir / "results/sweeps/hb"
    folder.mkdir(parents=True)
    found = manifest.Search(
        name="hb", folder=str(folder), method="random", trials=trials, parallel=2, metric="val_loss", mode="min",
        pruner="none", space=[{"key": "train.lr", "kind": "float", "low": 1e-3, "high": 1e-1, "log": True,
                               "choices": []}],
        storage=str(folder / "optuna.journal"), data=str(data), raw=tiny_params(), launcher="local",
        heartbeat_s=30.0, seed=0,
    )  # fmt: skip
    optuna.create_study(study_name="hb", storage=open_storage(found.storage))
    return found


def test_a_silent_trial_is_lost_and_replaced_a_beating_one_is_not(store_ready, prepared_digits):
    workdir = store_ready
    found = a_search(workdir, prepared_digits, trials=2)
    silent, beating = claim(found, worker=0), claim(found, worker=1)
    assert (silent, beating) == (0, 1)
    old = time.time() - 120  # the dead worker's last beat, two minutes ago
    os.utime(found.trial_dir(silent) / "heartbeat", (old, old))
    (found.trial_dir(beating) / "heartbeat").touch()

    replacement = claim(found, worker=1)  # the budget (2) has room once trial 0 is lost
    study = load_study(manifest.info(found))
    states = {t.number: t.state for t in study.trials}
    assert states == {0: optuna.trial.TrialState.FAIL, 1: optuna.trial.TrialState.RUNNING,
                      2: optuna.trial.TrialState.RUNNING}  # fmt: skip
    assert replacement == 2 and study.trials[0].user_attrs["lost"] is True
    assert "no heartbeat for 12" in study.trials[0].user_attrs["error"]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    lost_run = client.get_run(study.trials[0].user_attrs["run_id"])
    assert lost_run.info.status == "FAILED" and lost_run.data.tags["scalelab.trial_state"] == "lost"
    assert client.get_run(study.trials[1].user_attrs["run_id"]).info.status == "SCHEDULED"  # untouched

    # the budget is full (2 running, 0 ended): a claim waits; once both end it is spent
    for number in (1, 2):
        study.tell(number, 0.5)
    assert claim(found, worker=0) is None
    assert len(study.trials) == 3
