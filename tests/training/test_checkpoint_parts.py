"""The checkpoint manager of stateful parts: one registration adds a part, a checkpoint without a
registered part is refused by name, and the trainer registers every stateful field it holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_schedule import small_loop

from scalelab.runtime.dist import DistEnv
from scalelab.tracking import NullTracker
from scalelab.training.best import Best
from scalelab.training.checkpoint import Checkpointer, CheckpointError
from scalelab.training.checkpoint_parts import CheckpointParts, StateDict, loop_parts
from scalelab.training.meter import Meter
from scalelab.training.trainer import Trainer, register_parts


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state(self) -> int:
        return self.n

    def load(self, state: int) -> None:
        self.n = state


def test_a_new_part_is_one_registration_and_round_trips_through_a_checkpoint(tmp_path):
    trained, counter = small_loop(3), Counter()
    parts = loop_parts(trained, 0, DistEnv(), lambda: 3)
    parts.register("counter", counter)
    counter.n = 7
    state, shards = parts.state()
    assert shards is None and {"weights", "scaler", "scheduler", "rng", "counter"} <= set(state)
    ckpt = Checkpointer(tmp_path, "fp")
    ckpt.save(3, state)
    fresh, again = small_loop(0), Counter()
    parts = loop_parts(fresh, 0, DistEnv(), lambda: 3)
    parts.register("counter", again)
    parts.load(ckpt.load_latest())
    assert again.n == 7
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.model.state_dict().values(), trained.model.state_dict().values())
    )


def test_a_checkpoint_without_a_registered_part_is_refused_by_its_name():
    parts = loop_parts(small_loop(1), 0, DistEnv(), lambda: 1)
    state, _ = parts.state()
    parts.register("counter", Counter())
    with pytest.raises(CheckpointError, match="holds no counter"):
        parts.load({**state, "step": 1})
    parts.load({**state, "step": 1}, skip=("counter",))  # skipped on purpose: loads


def test_a_name_is_registered_once_and_never_one_the_checkpointer_writes():
    parts = CheckpointParts()
    parts.register("best", StateDict(Best("val_loss", "min")))
    for name in ("best", "step", "fingerprint"):
        with pytest.raises(ValueError, match="the name is taken"):
            parts.register(name, Counter())


def test_the_trainer_registers_every_stateful_field_it_holds():
    loop = small_loop(0)
    trainer = Trainer(
        loop=loop,
        loader=None,
        meter=Meter(0, 8),
        best=Best("val_loss", "min"),
        tracker=NullTracker(),
        env=DistEnv(),
        device=torch.device("cpu"),
        total_steps=10,
        steps_per_epoch=5,
        grad_accum_steps=1,
        log_every_steps=1,
    )
    register_parts(trainer, seed=0)
    registered = trainer.parts.parts
    assert list(registered)[0] == "weights" and list(registered)[-1] == "rng"
    assert {"counters", "meter_window", "pending_metrics", "best", *loop.stateful()} <= set(registered)
    wrapped = [getattr(p, "obj", None) for p in registered.values()]
    # every field of the trainer (and of its loop) with a state_dict(), found here independently
    for holder in (trainer, loop):
        for f in dataclasses.fields(holder):
            value = getattr(holder, f.name)
            if hasattr(value, "state_dict") and f.name not in ("model", "optimizer"):
                assert any(value is w for w in wrapped), f"{type(holder).__name__}.{f.name} is not a checkpoint part"
    trainer.step = 5
    state, _ = trainer.parts.state()
    assert state["counters"] == {"step": 5, "epoch": 1, "step_in_epoch": 0}
    trainer.step = 0
    trainer.parts.load({**state, "step": 5})
    assert trainer.step == 5


def test_a_checkpoint_of_the_older_layout_loads():
    trained, best = small_loop(2), Best("val_loss", "min")
    best.update({"val_loss": 0.5}, 2)
    state, _ = loop_parts(trained, 0, DistEnv(), lambda: 2).state()
    weights = state.pop("weights")
    older = {
        **weights,
        "parts": {"scaler": state["scaler"], "scheduler": state["scheduler"], "best": best.state_dict()},
    }
    older.update(rng=state["rng"], epoch=0, run_id=None, step=2)
    fresh, fresh_best = small_loop(0), Best("val_loss", "min")
    loop_parts(fresh, 0, DistEnv(), lambda: 2, {"best": fresh_best}).load(older)
    assert fresh_best.value == 0.5 and repr(fresh.optimizer.state_dict()) == repr(trained.optimizer.state_dict())
