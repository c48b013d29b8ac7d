"""`scalelab sweep submit --method tpe|random` on this machine (`sweep.launcher: local`): Optuna
samples, 4 local workers train, the journal storage keeps every trial, MLflow records each one, and
the best trial's run reproduces."""

import json
import subprocess

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from helpers import run_cli, tiny_params, write_params
from services import postgres  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def study_of(folder):
    from scalelab.training.pruning import open_storage

    return optuna.load_study(study_name=folder.name, storage=open_storage(str(folder / "optuna.journal")))


def local_search_repo(repo_copy) -> None:
    """The copy with tiny params for a local search (single, sgd, 2 epochs), committed and prepared."""
    params = tiny_params(
        train={"strategy": "single", "nproc_per_node": 1, "optimizer": "sgd", "epochs": 2},
        tracking={"system_metrics_interval_s": 0},
        sweep={"launcher": "local", "heartbeat_timeout_s": 60, "evaluate": False},
    )
    write_params(repo_copy / "params.yaml", params)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git, "commit", "-qam", "tiny params"], cwd=repo_copy, check=True)
    run_cli("prepare", "--params", "params.yaml", "--out", "data/prepared", cwd=repo_copy)


def test_four_parallel_local_workers_lose_no_trial_and_the_best_reproduces(repo_copy):
    local_search_repo(repo_copy)
    out = run_cli(
        "sweep", "submit", "--name", "lr", "--method", "tpe", "--trials", "8", "--parallel", "4",
        "--objective", "val_accuracy:max", "--pruner", "none",
        "-S", "train.lr=loguniform(1e-3,0.5)", "-S", "train.model.hidden=choice([16],[32])",
        cwd=repo_copy, timeout=900,
    ).stdout  # fmt: skip
    folder = repo_copy / "results/sweeps/lr"
    study = study_of(folder)
    trials = study.get_trials()
    assert len(trials) == 8, [t.state for t in trials]  # the storage lost none, and asked no extra one
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert sorted(t.user_attrs["worker"] for t in trials) != [0] * 8  # the workers shared the budget

    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    manifest = json.loads((folder / "manifest.json").read_text())
    parent = client.get_run(manifest["parent_run_id"])
    exp = parent.info.experiment_id
    children = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 8 and {c.info.status for c in children} == {"FINISHED"}
    by_number = {int(c.data.tags["scalelab.trial"]): c for c in children}
    for t in trials:  # each child holds its trial's sampled values, logged and trained with
        run = by_number[t.number]
        assert run.info.run_id == t.user_attrs["run_id"]
        assert float(run.data.params["sampled.train.lr"]) == pytest.approx(t.params["train.lr"])
        assert run.data.params["train.lr"] == run.data.params["sampled.train.lr"]
        assert run.data.params["train.model.hidden"] == str(json.loads(t.params["train.model.hidden"]))
        assert run.data.metrics["best_val_accuracy"] == pytest.approx(t.value)

    best = study.best_trial
    assert parent.info.status == "FINISHED" and parent.data.tags["scalelab.best_trial"] == str(best.number)
    assert parent.data.tags["scalelab.best_run_id"] == best.user_attrs["run_id"]
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(best.value)
    assert parent.data.metrics["compute_steps"] == sum(t.user_attrs["steps"] for t in trials)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.csv", "importance.csv", "objective.png"} <= artifacts, artifacts
    importance = pd.read_csv(folder / "importance.csv")
    assert set(importance.param) == {"train.lr", "train.model.hidden"}, importance
    summary = pd.read_csv(folder / "summary.csv")
    assert sorted(summary.trial) == list(range(8)) and set(summary.state) == {"finished"}
    assert f"best: trial {best.number}" in out

    reproduced = run_cli("reproduce", best.user_attrs["run_id"], "--yes", cwd=repo_copy, timeout=600).stdout
    assert "RESULT: match" in reproduced, reproduced


@pytest.mark.postgres
def test_a_search_on_postgresql_loses_no_trial_under_4_parallel_workers(workdir, prepared_digits, postgres):
    import psycopg2

    conn = psycopg2.connect(postgres.uri)  # a database of its own: Optuna's and MLflow's schemas share table names
    conn.autocommit = True
    conn.cursor().execute("CREATE DATABASE optuna")
    conn.close()
    storage = postgres.uri.rsplit("/", 1)[0] + "/optuna"
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train={"strategy": "single", "nproc_per_node": 1, "epochs": 1},
            tracking={"system_metrics_interval_s": 0},
            sweep={"launcher": "local", "evaluate": False, "storage": storage},
        ),
    )
    run_cli(
        "sweep", "submit", "--name", "pg", "--data", str(prepared_digits), "--method", "random", "--trials", "4",
        "--parallel", "4", "-S", "train.lr=loguniform(1e-3,0.1)", cwd=workdir, timeout=600,
    )  # fmt: skip
    from scalelab.training.pruning import open_storage

    trials = optuna.load_study(study_name="pg", storage=open_storage(storage)).get_trials()
    assert len(trials) == 4 and {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert len({t.user_attrs["worker"] for t in trials}) > 1  # the 4 workers shared them
    assert not (workdir / "results/sweeps/pg/optuna.journal").exists()


def test_a_local_grid_over_two_seeds_prints_the_best_trial_and_the_mean_per_setting(workdir, prepared_digits):
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train={"strategy": "single", "nproc_per_node": 1, "optimizer": "sgd", "epochs": 1},
            tracking={"system_metrics_interval_s": 0},
            sweep={"launcher": "slurm", "evaluate": False},  # -S sweep.launcher=local runs it here (issue 31)
        ),
    )
    out = run_cli(
        "sweep", "submit", "--name", "seeds", "--data", str(prepared_digits), "--parallel", "2",
        "-S", "sweep.launcher=local", "-S", "train.seed=0,1", "-S", "train.lr=0.01,0.1", cwd=workdir, timeout=600,
    ).stdout  # fmt: skip
    folder = workdir / "results/sweeps/seeds"
    study = study_of(folder)
    assert len(study.trials) == 4 and {t.state for t in study.trials} == {optuna.trial.TrialState.COMPLETE}
    best = study.best_trial
    line = f"best: trial {best.number}, val_loss = {best.value:.6g}, run {best.user_attrs['run_id']}"
    assert line in out, out
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    assert client.get_run(best.user_attrs["run_id"]).data.tags["scalelab.trial"] == str(best.number)

    collected = run_cli("sweep", "collect", "--name", "seeds", cwd=workdir).stdout  # a later collect says it too
    assert line in collected and "run_id" in collected.splitlines()[0].split(), collected
    summary = pd.read_csv(folder / "summary.csv")
    assert all(run in collected for run in summary.run_id), collected
    table = pd.read_csv(folder / "summary_by_setting.csv").set_index("param.train.lr")
    assert sorted(table.index) == [0.01, 0.1] and list(table.n) == [2, 2], table
    for lr, row in table.iterrows():
        values = summary[summary["param.train.lr"] == lr].value
        assert row.best_val_loss_mean == pytest.approx(values.mean())
        assert row.best_val_loss_std == pytest.approx(values.std(ddof=1))
    assert "per setting" in out and "summary_by_setting.csv" in out, out
