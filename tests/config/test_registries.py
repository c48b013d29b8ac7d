"""The registries (config/names.py): optimizers, LR schedules, data sources, samplers and pruners, one object
each. The schema allows exactly their names, what builds them is keyed the same, and any other name
is refused with the key, the value and the allowed names, never built as a fallback."""

import typing

import optuna
import pytest
import torch

from helpers import run_cli, tiny_params, write_params
from scalelab.config import ConfigError, DataConfig, TrainConfig, names, parse_params
from scalelab.config.schema import DATA_KINDS
from scalelab.data.features import FEATURE_READERS
from scalelab.data.prepare import TOKEN_READERS
from scalelab.sweeps import samplers
from scalelab.training import pruning, schedule
from scalelab.training.loop import OPTIMIZERS, Optim


def test_an_unknown_optimizer_name_is_refused_not_built_as_sgd():
    with pytest.raises(ConfigError, match=r"optimizer = 'adam' is not allowed: expected one of 'adamw' \| 'sgd'"):
        Optim(name="adam", lr=1e-3).build([torch.nn.Parameter(torch.zeros(2))])


def test_an_unknown_lr_schedule_is_refused_not_decayed_linearly():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    allowed = r"expected one of 'constant' \| 'cosine' \| 'linear' \| 'wsd'"
    with pytest.raises(ConfigError, match=f"lr_schedule = 'cosin' is not allowed: {allowed}"):
        schedule.build(opt, total_steps=10, schedule="cosin", warmup_steps=2)  # before any step, warm-up or not
    with pytest.raises(ConfigError, match="lr_schedule = 'cosin' is not allowed"):
        schedule.lr_factor(5, total_steps=10, schedule="cosin", warmup_steps=0, min_ratio=0.0)


def test_an_unknown_pruner_is_refused_not_built_as_no_pruner():
    with pytest.raises(ConfigError, match=r"^--pruner = 'asha' is not allowed: expected one of 'none' \| 'median'"):
        pruning.make_pruner("asha")
    assert type(pruning.make_pruner("halving")) is optuna.pruners.SuccessiveHalvingPruner
    assert type(pruning.make_pruner("median")) is optuna.pruners.MedianPruner


def test_an_unknown_data_source_is_refused_naming_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"data.source = 'csv' is not allowed: expected one of 'digits' \|.* 'jsonl'"):
        parse_params(tiny_params(data={"source": "csv"}), "params.yaml")


def test_the_schema_and_what_builds_read_one_table_of_names():
    hints = typing.get_type_hints(TrainConfig)
    assert typing.get_args(hints["optimizer"]) == tuple(names.OPTIMIZERS) and set(OPTIMIZERS) == set(names.OPTIMIZERS)
    assert typing.get_args(hints["lr_schedule"]) == tuple(names.LR_SCHEDULES)
    assert typing.get_args(typing.get_type_hints(DataConfig)["source"]) == tuple(names.DATA_SOURCES)
    assert DATA_KINDS == {n: s.kind for n, s in names.DATA_SOURCES.items()}
    assert set(TOKEN_READERS) == {n for n, s in names.DATA_SOURCES.items() if s.kind == "tokens"}
    assert set(FEATURE_READERS) == {n for n, s in names.DATA_SOURCES.items() if s.kind == "features"}
    assert set(pruning.PRUNERS) == set(names.PRUNERS)
    assert set(samplers.SAMPLERS) == set(names.SAMPLERS)
    for name in names.OPTIMIZERS:  # each builds its own optimizer
        built = Optim(name=name).build([torch.nn.Parameter(torch.zeros(2))])
        assert type(built).__name__.lower() == name
    with pytest.raises(ConfigError, match=r"train.optimizer = 'adam' is not allowed: expected one of 'adamw' \| 'sgd'"):
        parse_params(tiny_params(train={"optimizer": "adam"}), "params.yaml")


@pytest.mark.integration  # the CLI, in a process of its own
@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [("--pruner", "asha", "'halving'"), ("--method", "bayes", "'grid' | 'tpe' | 'random'")],
)
def test_sweep_submit_refuses_an_unknown_pruner_or_method_in_one_line_before_anything_starts(
    workdir, prepared_digits, option, value, allowed
):
    write_params(workdir / "params.yaml", tiny_params(sweep={"launcher": "local"}))
    options = {"--method": "grid", "--pruner": "none", option: value}
    proc = run_cli(
        "sweep", "submit", "--name", "s", *(a for pair in options.items() for a in pair),
        "--data", str(prepared_digits), "-S", "train.lr=0.1,0.2", cwd=workdir, check=False,
    )  # fmt: skip
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and f"{option} = '{value}' is not allowed" in last and allowed in last, proc.stderr
    assert not (workdir / "results").exists()
