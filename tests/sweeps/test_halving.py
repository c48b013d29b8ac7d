"""`scalelab sweep submit --pruner halving`: Optuna's successive halving on a local search. Trials
that are not in the best third at a rung (1, 3, 9 ... validations) are stopped there, having trained
fewer steps than the trials that go on."""

import json

import optuna
import pytest
from test_search import local_search_repo

from helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_local_search_with_halving_prunes_the_trials_outside_the_best_third(repo_copy):
    local_search_repo(repo_copy)
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
