"""The strategy registry: the schema allows exactly the registered names, each object states what
the config, the shape check and the study used to compare its name for, and training's objects
carry the same facts with a `wrap`."""

import typing

import pytest
import torch
from torch import nn

from scalelab.config import ConfigError, TrainConfig, build, strategies
from scalelab.config.schema import StrategyName
from scalelab.training import strategy

# name: (distributed, sharded, parallel, world size at nproc_per_node=2 and num_nodes=1)
TODAY = {
    "single": (False, False, False, 1),
    "dp": (False, False, True, 1),
    "ddp": (True, False, True, 2),
    "fsdp": (True, True, True, 2),
}


def test_the_schema_allows_exactly_the_registered_strategies():
    allowed = set(typing.get_args(StrategyName))
    assert allowed == set(strategies.STRATEGIES) == set(strategy.STRATEGIES) == set(TODAY)
    assert TrainConfig.__dataclass_fields__["strategy"].default in allowed


@pytest.mark.parametrize("name", sorted(TODAY))
def test_each_strategy_states_what_callers_compared_its_name_for(name):
    s = strategies.get(name)
    distributed, sharded, parallel, world = TODAY[name]
    assert (s.name, s.distributed, s.sharded, s.parallel) == (name, distributed, sharded, parallel)
    assert s.processes(2) == world
    assert TrainConfig(strategy=name, nproc_per_node=2, num_nodes=1).world_size == world
    assert TrainConfig(strategy=name, nproc_per_node=2, num_nodes=3).world_size == (6 if distributed else 1)
    assert s.min_cuda_devices == (2 if name == "dp" else 0)


@pytest.mark.parametrize("name", sorted(TODAY))
def test_training_objects_extend_the_registered_facts_with_wrap(name):
    obj = strategy.get(name)
    assert isinstance(obj, strategies.Strategy)
    facts = strategies.get(name)
    assert all(getattr(obj, f) == getattr(facts, f) for f in facts.__dataclass_fields__)


def test_single_and_dp_wrap_a_model_on_this_device():
    device = torch.device("cpu")
    assert isinstance(strategy.get("single").wrap(nn.Linear(2, 2), device), nn.Linear)
    assert isinstance(strategy.get("dp").wrap(nn.Linear(2, 2), device), nn.DataParallel)
    with torch.device("meta"):
        on_meta = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="needs strategy fsdp, not 'ddp'"):
        strategy.get("ddp").wrap(on_meta, device)


ALLOWED = r"is not allowed: expected one of 'single' \| 'dp' \| 'ddp' \| 'fsdp'"


@pytest.mark.parametrize("get", [strategies.get, strategy.get], ids=["config", "training"])
def test_an_unknown_strategy_is_refused_naming_the_allowed_ones(get):
    with pytest.raises(ConfigError, match=f"^strategy = 'zero' {ALLOWED}$"):
        get("zero")


def test_params_refuse_an_unregistered_strategy_naming_the_registered_ones():
    with pytest.raises(ConfigError, match=f"^train.strategy = 'zero' {ALLOWED}$"):
        build(TrainConfig, {"strategy": "zero"}, "train")
