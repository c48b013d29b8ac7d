"""Optimizer and LR schedule names come from one table (config/names.py): the schema allows exactly
those, training builds exactly those, and any other name is refused, never built as a fallback."""

import typing

import pytest
import torch

from helpers import tiny_params
from scalelab.config import ConfigError, TrainConfig, names, parse_params
from scalelab.training import schedule
from scalelab.training.loop import OPTIMIZERS, Optim


def test_an_unknown_optimizer_name_is_refused_not_built_as_sgd():
    with pytest.raises(ConfigError, match=r"optimizer = 'adam' is not allowed: expected one of 'adamw' \| 'sgd'"):
        Optim(name="adam", lr=1e-3).build([torch.nn.Parameter(torch.zeros(2))])


def test_an_unknown_lr_schedule_is_refused_not_decayed_linearly():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    allowed = r"expected one of 'constant' \| 'cosine' \| 'linear'"
    with pytest.raises(ConfigError, match=f"lr_schedule = 'cosin' is not allowed: {allowed}"):
        schedule.build(opt, total_steps=10, schedule="cosin", warmup_steps=2)  # before any step, warm-up or not
    with pytest.raises(ConfigError, match="lr_schedule = 'cosin' is not allowed"):
        schedule.lr_factor(5, total_steps=10, schedule="cosin", warmup_steps=0, min_ratio=0.0)


def test_the_schema_and_training_read_one_table_of_names():
    hints = typing.get_type_hints(TrainConfig)
    assert typing.get_args(hints["optimizer"]) == tuple(names.OPTIMIZERS) and set(OPTIMIZERS) == set(names.OPTIMIZERS)
    assert typing.get_args(hints["lr_schedule"]) == tuple(names.LR_SCHEDULES)
    assert set(schedule.DECAYS) == set(names.LR_SCHEDULES)
    for name in names.OPTIMIZERS:  # each builds its own optimizer
        built = Optim(name=name).build([torch.nn.Parameter(torch.zeros(2))])
        assert type(built).__name__.lower() == name
    with pytest.raises(ConfigError, match=r"train.optimizer = 'adam' is not allowed: expected one of 'adamw' \| 'sgd'"):
        parse_params(tiny_params(train={"optimizer": "adam"}), "params.yaml")
