"""What `scalelab sweep collect` and `status` show, on sweeps made by hand (no training): the best
trial with its MLflow run id, the run id column on screen, a pruned trial's value alike in status
and summary.csv, and the mean and spread over seeds per setting (summary_by_setting.csv), for a
grid on SLURM (scalelab.sweeps.sweep) and a search or local grid (search_collect) alike."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from scalelab.config.space import parse_space
from scalelab.sweeps import sweep
from scalelab.sweeps.manifest import Search
from scalelab.sweeps.sweep_table import by_setting
from scalelab.tracking import tracking_uri
from scalelab.training.pruning import open_storage


def make_search(workdir: Path, name: str, specs: list[str], metric: str = "val_loss", mode: str = "min") -> Search:
    """A search's manifest and an empty study under results/sweeps/<name> (launcher local, a budget
    no test spends, a heartbeat that never goes stale: collect never finishes the parent run)."""
    folder = workdir / "results/sweeps" / name
    folder.mkdir(parents=True)
    search = Search(
        name=name, folder=str(folder), method="grid", trials=100, parallel=1, metric=metric, mode=mode,
        pruner="median", space=[d.to_dict() for d in parse_space(specs).values()],
        storage=str(folder / "optuna.journal"), data=str(workdir / "data"), raw={}, launcher="local",
        heartbeat_s=3600.0, seed=0, parent_run_id="parent-not-needed",
    )  # fmt: skip
    search.save()
    optuna.create_study(
        study_name=name, storage=open_storage(search.storage), direction="minimize" if mode == "min" else "maximize"
    )
    return search


def add_trial(search: Search, values: dict[str, object], reports: list[float], end: str, run_id: str) -> None:
    """A trial of `values` that reported `reports` at validations 1, 2, ... and ended `end`:
    'finished' (told its best report, as search_worker.tell does), 'pruned' or 'running'."""
    study = optuna.load_study(study_name=search.name, storage=open_storage(search.storage))
    study.enqueue_trial({k: json.dumps(v) for k, v in values.items()})
    trial = study.ask({k: d.distribution() for k, d in search.dims.items()})
    trial.set_user_attr("run_id", run_id)
    for step, value in enumerate(reports, 1):
        trial.report(value, step)
    if end == "finished":
        study.tell(trial, min(reports) if search.mode == "min" else max(reports))
    elif end == "pruned":
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def collect(name: str, capsys) -> str:
    capsys.readouterr()
    assert sweep.collect(argparse.Namespace(name=name)) == 0
    return capsys.readouterr().out


@pytest.fixture
def running_search(workdir: Path) -> Search:
    """Two finished trials (the second the best) and one still running: the budget is not spent."""
    search = make_search(workdir, "lr", ["train.lr=0.001,0.003,0.01"])
    add_trial(search, {"train.lr": 0.001}, [0.9, 0.7], "finished", "run-slow")
    add_trial(search, {"train.lr": 0.003}, [0.6, 0.4], "finished", "run-best")
    add_trial(search, {"train.lr": 0.01}, [0.8], "running", "run-running")
    return search


def test_search_collect_prints_the_best_trial_with_its_run_id(running_search, capsys):
    assert "best: trial 1, val_loss = 0.4, run run-best" in collect("lr", capsys)
    assert "best: trial 1, val_loss = 0.4, run run-best" in collect("lr", capsys)  # every collect, not the first


def test_search_collect_shows_the_run_id_column(running_search, capsys):
    out = collect("lr", capsys)
    assert "run_id" in out.splitlines()[0].split(), out
    assert all(run in out for run in ("run-slow", "run-best", "run-running")), out


def test_a_pruned_trials_value_is_the_same_in_status_and_summary_csv(workdir, capsys):
    search = make_search(workdir, "pr", ["train.lr=0.001,0.1"])
    add_trial(search, {"train.lr": 0.001}, [1.9, 1.2], "finished", "run-a")
    add_trial(search, {"train.lr": 0.1}, [2.5, 2.14], "pruned", "run-b")  # pruned at its 2nd validation
    add_trial(search, {"train.lr": 0.001}, [], "running", "run-c")
    capsys.readouterr()
    assert sweep.status(argparse.Namespace(name="pr")) == 0
    status = {int(line.split()[1]): line.split()[3] for line in capsys.readouterr().out.splitlines()}
    collect("pr", capsys)
    summary = pd.read_csv(workdir / "results/sweeps/pr/summary.csv").set_index("trial")
    assert summary.loc[1, "state"] == "pruned"
    assert summary.loc[1, "value"] == float(status[1]) == 2.14  # the last reported value, in both
    assert summary.loc[0, "value"] == float(status[0]) == 1.2  # a finished trial: its best value
    assert math.isnan(summary.loc[2, "value"]) and status[2] == "None"  # still running: none yet


def test_a_local_grid_over_seeds_reports_mean_std_and_n_per_setting(workdir, capsys):
    search = make_search(workdir, "seeds", ["train.seed=0,1,2", "train.lr=0.001,0.003"])
    for seed, (slow, fast) in enumerate([(0.5, 0.2), (0.7, 0.4), (0.9, None)]):
        add_trial(search, {"train.seed": seed, "train.lr": 0.001}, [slow], "finished", f"run-s{seed}")
        if fast is not None:
            add_trial(search, {"train.seed": seed, "train.lr": 0.003}, [fast], "finished", f"run-f{seed}")
    add_trial(search, {"train.seed": 2, "train.lr": 0.003}, [0.35], "pruned", "run-f2")  # not a result
    add_trial(search, {"train.seed": 0, "train.lr": 0.001}, [], "running", "run-x")  # the budget is not spent
    out = collect("seeds", capsys)
    table = pd.read_csv(workdir / "results/sweeps/seeds/summary_by_setting.csv")
    rows = table.set_index("param.train.lr")
    assert list(rows.n) == [3, 2] and list(rows.runs) == [4, 3], table
    assert rows.loc[0.001, "best_val_loss_mean"] == pytest.approx(0.7)
    assert rows.loc[0.001, "best_val_loss_std"] == pytest.approx(0.2)  # sample std of 0.5, 0.7, 0.9
    assert rows.loc[0.003, "best_val_loss_mean"] == pytest.approx(0.3)
    assert rows.loc[0.003, "seeds"] == "0 1"
    assert "per setting" in out and "summary_by_setting.csv" in out and "0.7" in out, out
    assert "best: trial 1, val_loss = 0.2, run run-f0" in out, out


def test_no_per_setting_file_without_a_seed_dimension(workdir, capsys):
    search = make_search(workdir, "noseed", ["train.lr=0.001,0.003"])
    add_trial(search, {"train.lr": 0.001}, [0.5], "finished", "run-a")
    add_trial(search, {"train.lr": 0.003}, [0.5], "running", "run-b")
    assert "per setting" not in collect("noseed", capsys)
    assert not (workdir / "results/sweeps/noseed/summary_by_setting.csv").exists()


def test_by_setting_groups_list_values_and_a_grid_of_seeds_alone():
    frame = pd.DataFrame(
        {
            "override.train.model.hidden": [[32], [32], [64], [64]],
            "override.train.seed": [0, 1, 0, 1],
            "loss": [1.0, 3.0, 2.0, None],
            "status": ["finished"] * 4,
        }
    )
    table = by_setting(frame, "override.", {"loss": "loss"}, frame.status == "finished")
    assert list(table["override.train.model.hidden"]) == ["[32]", "[64]"]
    assert list(table.loss_mean) == [2.0, 2.0] and table.loss_std[0] == pytest.approx(math.sqrt(2))
    assert math.isnan(table.loss_std[1])  # one value: no spread
    alone = by_setting(frame.drop(columns=["override.train.model.hidden"]), "override.", {"loss": "loss"},
                       frame.status == "finished")  # fmt: skip
    assert len(alone) == 1 and alone.n[0] == 4 and alone.loss_mean[0] == pytest.approx(2.0)


class FakeJob(SimpleNamespace):
    """What collect asks of a submitit job: its state."""


@pytest.fixture
def grid_sweep(store_ready, monkeypatch) -> tuple[Path, list[dict]]:
    """A grid sweep on SLURM (its manifest, MLflow runs and job states faked): lr 0.001 and 0.003
    over seeds 0 and 1, the last element still pending."""
    client = MlflowClient(tracking_uri())
    exp = client.create_experiment("scalelab")
    folder = store_ready / "results/sweeps/g"
    elements = []
    grid = [(0.001, 0, 0.5), (0.001, 1, 0.7), (0.003, 0, 0.3), (0.003, 1, None)]
    for i, (lr, seed, loss) in enumerate(grid):
        run = client.create_run(exp).info.run_id
        out = folder / f"{i:03d}"
        out.mkdir(parents=True)
        if loss is not None:
            client.log_metric(run, "best_val_loss", loss)
            client.log_metric(run, "test_accuracy", 1 - loss)
            (out / "run.json").write_text(json.dumps({"run_id": run}))
        overrides = {"train.lr": lr, "train.seed": seed}
        elements.append({"index": i, "overrides": overrides, "run_id": run, "out": str(out), "job_id": f"7_{i}"})
    manifest = {"name": "g", "parent_run_id": client.create_run(exp).info.run_id, "metric": "val_loss"}
    (folder / "manifest.json").write_text(json.dumps({**manifest, "mode": "min", "elements": elements}))
    states = {f"7_{i}": "PENDING" if loss is None else "COMPLETED" for i, (_, _, loss) in enumerate(grid)}
    monkeypatch.setattr(sweep, "_job", lambda element: FakeJob(state=states[element["job_id"]]))
    return folder, elements


def test_grid_collect_prints_the_best_element_with_its_run_id(grid_sweep, capsys):
    folder, elements = grid_sweep
    out = collect("g", capsys)
    assert f"best: element 002, val_loss = 0.3, run {elements[2]['run_id']}" in out, out
    summary = pd.read_csv(folder / "summary.csv")
    assert list(summary.best_val_loss[:3]) == [0.5, 0.7, 0.3]


def test_grid_collect_shows_the_run_id_column(grid_sweep, capsys):
    _, elements = grid_sweep
    out = collect("g", capsys)
    assert "run_id" in out.splitlines()[0].split(), out
    assert all(e["run_id"] in out for e in elements), out


def test_grid_collect_reports_mean_std_and_n_over_seeds_per_setting(grid_sweep, capsys):
    folder, _ = grid_sweep
    out = collect("g", capsys)
    table = pd.read_csv(folder / "summary_by_setting.csv").set_index("override.train.lr")
    assert list(table.n) == [2, 1] and list(table.runs) == [2, 2], table
    assert table.loc[0.001, "best_val_loss_mean"] == pytest.approx(0.6)
    assert table.loc[0.001, "best_val_loss_std"] == pytest.approx(math.sqrt(0.02))
    assert table.loc[0.001, "test_accuracy_mean"] == pytest.approx(0.4)
    assert math.isnan(table.loc[0.003, "best_val_loss_std"])  # one finished seed: no spread yet
    assert "per setting" in out and "summary_by_setting.csv" in out, out
