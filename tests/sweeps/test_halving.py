"""`scalelab sweep submit --pruner halving`: Optuna's successive halving on a local search. Trials
that are not in the best third at a rung (1, 3, 9 ... validations) are stopped there, having trained
fewer steps than the trials that go on."""

import json
import subprocess

import optuna
import pytest

from helpers import run_cli, tiny_params, write_params

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_local_search_with_halving_prunes_the_trials_outside_the_best_third(repo_copy):
    params = tiny_params(
        train={"strategy": "single", "nproc_per_node": 1, "optimizer": "sgd", "epochs": 2},
        tracking={"system_metrics_interval_s": 0},
        sweep={"launcher": "local", "heartbeat_timeout_s": 60, "evaluate": False},
    )
    write_params(repo_copy / "params.yaml", params)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git, "commit", "-qam", "tiny params"], cwd=repo_copy, check=True)
    run_cli("prepare", "--params", "params.yaml", "--out", "data/prepared", cwd=repo_copy)
    run_cli(
        "sweep", "submit", "--name", "sha", "--method", "random", "--trials", "6", "--parallel", "1",
        "--objective", "val_loss:min", "--pruner", "halving", "-S", "train.lr=loguniform(1e-6,0.3)",
        cwd=repo_copy, timeout=900,
    )  # fmt: skip
    folder = repo_copy / "results/sweeps/sha"
    assert json.loads((folder / "manifest.json").read_text())["pruner"] == "halving"
    from scalelab.training.pruning import load_study

    study = load_study({"study": "sha", "storage": str(folder / "optuna.journal"), "pruner": "halving"})
    assert type(study.pruner) is optuna.pruners.SuccessiveHalvingPruner
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert len(trials) == 6 and set(states) == {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    finished = {t.user_attrs["steps"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert all(t.user_attrs["steps"] < min(finished) for t in pruned)  # stopped early: fewer steps trained
    assert all(max(t.intermediate_values) == 1 for t in pruned)  # at the first rung: 1 validation (then 3, 9)
