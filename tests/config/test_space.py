"""Search spaces (`-S 'train.lr=loguniform(1e-4,1e-1)'`): parsed, checked, turned into Optuna
distributions, and every bound put in front of the params schema."""

import math

import pytest

from scalelab.config import ConfigError
from scalelab.config.space import Dimension, corners, parse_space


def test_each_function_and_list_form_parses_to_its_dimension():
    space = parse_space(
        [
            "train.lr=loguniform(1e-4,1e-1)",
            "train.momentum=uniform(0,0.99)",
            "train.lr_warmup_steps=int(0,200)",
            "train.batch_size=logint(16,256)",
            "train.model.hidden=choice([256,256],[512,512])",
            "train.optimizer=adamw,sgd",
            "train.epochs=3",
        ]
    )
    assert space["train.lr"] == Dimension("train.lr", "float", 1e-4, 1e-1, log=True)
    assert space["train.momentum"] == Dimension("train.momentum", "float", 0.0, 0.99)
    assert space["train.lr_warmup_steps"] == Dimension("train.lr_warmup_steps", "int", 0, 200)
    assert space["train.batch_size"] == Dimension("train.batch_size", "int", 16, 256, log=True)
    assert space["train.model.hidden"].choices == ([256, 256], [512, 512])
    assert space["train.optimizer"].choices == ("adamw", "sgd")
    assert space["train.epochs"].choices == (3,)
    for dim in space.values():  # the manifest's JSON round trip
        assert Dimension.from_dict(dim.to_dict()) == dim


def test_distributions_sample_values_of_the_right_kind():
    import optuna

    space = parse_space(["train.lr=loguniform(1e-4,1e-1)", "train.model.hidden=choice([8],[16,16])", "n=int(1,5)"])
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask({k: d.distribution() for k, d in space.items()})
        values = {k: space[k].value(trial.params[k]) for k in space}
        assert 1e-4 <= values["train.lr"] <= 1e-1
        assert values["train.model.hidden"] in ([8], [16, 16])
        assert isinstance(values["n"], int) and 1 <= values["n"] <= 5
        study.tell(trial, math.log(values["train.lr"]))
    assert study.trials[0].distributions["train.lr"].log


@pytest.mark.parametrize(
    "spec, words",
    [
        ("train.lr=loguniform(0,1)", "a log scale needs low > 0"),
        ("train.lr=loguniform(-1e-3,1)", "a log scale needs low > 0"),
        ("train.lr=uniform(1,0.5)", "low = 1 must be below high = 0.5"),
        ("train.lr=uniform(1,1)", "must be below"),
        ("train.lr=loguniform(1e-4)", "takes two bounds"),
        ("train.lr=uniform(a,1)", "must be finite numbers"),
        ("train.lr=uniform(0,.inf)", "must be finite numbers"),
        ("train.epochs=int(1.5,3)", "must be integers"),
        ("train.epochs=int(true,3)", "must be integers"),
        ("train.lr=normal(0,1)", "'normal' is not a search function"),
        ("train.lr=choice()", "give one or more values"),
        ("train.lr=choice(1,1)", "each once"),
        ("train.lr=0.1,0.1", "each once"),
        ("train.lr=", "write -S section.key=<space>"),
        ("=1", "write -S section.key=<space>"),
        ("train.lr", "write -S section.key=<space>"),
        ("train.model.hidden=choice([1,2", "the parenthesis is not closed"),
        ("train.model.hidden=[1,2", "write lists in brackets"),
    ],
)
def test_bad_specs_are_refused_with_the_spec_and_the_rule(spec, words):
    with pytest.raises(ConfigError) as err:
        parse_space([spec])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_key_given_twice_is_refused():
    with pytest.raises(ConfigError, match="given twice"):
        parse_space(["train.lr=0.1", "train.lr=loguniform(1e-3,1)"])


def test_corners_put_every_bound_and_choice_in_front_of_the_schema():
    space = parse_space(["train.lr=loguniform(1e-4,1e-1)", "train.optimizer=adamw,sgd", "train.epochs=int(1,9)"])
    seen = corners(space)
    assert seen[0] == {"train.lr": 1e-4, "train.optimizer": "adamw", "train.epochs": 1}
    for key, dim in space.items():
        assert {c[key] for c in seen} == set(dim.ends())
    assert len(seen) == 1 + 1 + 1 + 1  # the first of each, then each other end alone
