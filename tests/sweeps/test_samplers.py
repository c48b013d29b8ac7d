"""The grid has one path (sweeps/samplers.py): the points a SLURM job array submits as its elements
are the points a local or pruned grid runs as trials, in the same order; a lost trial's point is
run again, a budget larger than the grid goes round it again. Every `--method` is built from the
registry (config/names.py), and any other name is refused."""

import optuna
import pytest

from scalelab.config import ConfigError, names
from scalelab.config.space import parse_space
from scalelab.sweeps.samplers import SAMPLERS, grid_points, make_sampler

SPECS = ["train.lr=0.01,0.1", "train.model.hidden=[16],[32,32]", "train.seed=0,1"]


def ask(study, space, method="grid", seed=0):
    sampler = make_sampler(method, space, study, seed, budget=8)
    study = optuna.load_study(study_name=study.study_name, storage=study._storage, sampler=sampler)
    trial = study.ask({k: d.distribution() for k, d in space.items()})
    return trial, {k: space[k].value(trial.params[k]) for k in space}


@pytest.fixture
def study():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="g", storage=optuna.storages.InMemoryStorage())


def test_a_grid_runs_the_points_of_the_job_array_in_its_order(study):
    space = parse_space(SPECS)
    points = grid_points(space)
    assert len(points) == 8 and points[0] == {"train.lr": 0.01, "train.model.hidden": [16], "train.seed": 0}
    assert points[1]["train.seed"] == 1 and points[-1] == {
        "train.lr": 0.1,
        "train.model.hidden": [32, 32],
        "train.seed": 1,
    }
    asked = [ask(study, space)[1] for _ in range(8)]  # trials still running: each takes a point no one holds
    assert asked == points


def test_a_lost_trials_point_runs_again_and_a_larger_budget_goes_round_the_grid(study):
    space = parse_space(["train.lr=0.01,0.1,1.0"])
    first, _ = ask(study, space)
    study.tell(first, 0.5)
    lost, lost_point = ask(study, space)
    study._storage.set_trial_user_attr(lost._trial_id, "lost", True)
    study.tell(lost, state=optuna.trial.TrialState.FAIL)
    assert ask(study, space)[1] == lost_point == {"train.lr": 0.1}  # lost: run again, before lr 1.0
    assert [ask(study, space)[1] for _ in range(2)] == [{"train.lr": 1.0}, {"train.lr": 0.01}]  # then round again


def test_a_grid_refuses_a_range_naming_it():
    with pytest.raises(ConfigError, match=r"-S train.lr=loguniform\(0.001, 0.1\): --method grid takes lists"):
        grid_points(parse_space(["train.lr=loguniform(1e-3,1e-1)", "train.seed=0,1"]))


def test_every_method_is_built_from_the_registry_and_no_other(study):
    assert list(SAMPLERS) == list(names.SAMPLERS)
    space = parse_space(["train.lr=loguniform(1e-3,1e-1)"])
    assert type(make_sampler("tpe", space, study, 0, 8)) is optuna.samplers.TPESampler
    assert type(make_sampler("random", space, study, 0, 8)) is optuna.samplers.RandomSampler
    with pytest.raises(
        ConfigError, match=r"^--method = 'bayes' is not allowed: expected one of 'grid' \| 'tpe' \| 'random'$"
    ):
        make_sampler("bayes", space, study, 0, 8)
