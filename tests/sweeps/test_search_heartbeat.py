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


def test_every_rank_of_an_element_follows_rank_0s_decision_on_each_trial(store_ready, prepared_digits, monkeypatch):
    """Ranks that each asked the study could disagree (rank 0 trains, rank 1 skips: a hang until the
    collective timeout); rank 0 decides once per start of the element and the others follow."""
    from scalelab.sweeps import search_worker

    found = a_search(store_ready, prepared_digits, trials=2)
    rank0, rank1 = search_worker.claims(found, 0, rank=0), search_worker.claims(found, 0, rank=1)
    first = next(rank0)  # claimed and decided open by rank 0
    study = load_study(manifest.info(found))
    study.tell(first, state=optuna.trial.TrialState.FAIL)  # then ended (marked lost) before rank 1 asks
    assert next(rank1) == first  # rank 1 runs what rank 0 runs

    # a requeued element (another attempt) decides anew: the ended trial is skipped by every rank
    again0 = search_worker.claims(found, 0, rank=0, attempt="1")
    again1 = search_worker.claims(found, 0, rank=1, attempt="1")
    second = next(again0)
    assert second != first and next(again1) == second

    # a rank whose rank 0 never writes fails at a deadline instead of waiting forever
    monkeypatch.setattr(search_worker, "RANK0_WAIT_MIN_S", 0.5)
    monkeypatch.setattr(found, "heartbeat_s", 0.1)
    lonely = search_worker.claims(found, 1, rank=1)
    with pytest.raises(RuntimeError, match="rank 0 did not write .*claim-000.json within 0 s: it died or hangs"):
        next(lonely)
