"""LR schedules against their formula, and the loop's stateful parts (the checkpoint holds each)."""

import math

import pytest
import torch

from scalelab.runtime.dist import DistEnv
from scalelab.training import schedule
from scalelab.training.best import Best
from scalelab.training.checkpoint import checkpoint_state, restore
from scalelab.training.loop import Loop, Optim, build_loop
from scalelab.training.workloads import Workload


def lrs(total: int, **kwargs) -> list[float]:
    """The lr of each of `total` optimizer steps, as Loop.step sees it."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = schedule.build(opt, total_steps=total, **kwargs)
    seen = []
    for _ in range(total):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


def test_cosine_after_a_linear_warmup_at_chosen_steps():
    got = lrs(110, schedule="cosine", warmup_steps=10, min_ratio=0.1)
    # warm-up: lr * (k + 1) / 10 for steps k = 0..9; then 0.1 * (0.1 + 0.9 * (1 + cos(pi * p)) / 2),
    # p = (k - 10) / 99, reaching lr * min_ratio at the last step (k = 109)
    assert got[0] == pytest.approx(0.01) and got[4] == pytest.approx(0.05) and got[9] == pytest.approx(0.1)
    assert got[10] == pytest.approx(0.1)
    for k in (30, 59, 100):
        p = (k - 10) / 99
        assert got[k] == pytest.approx(0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))))
    assert got[-1] == pytest.approx(0.01)


def test_linear_and_constant():
    got = lrs(21, schedule="linear", warmup_steps=0, min_ratio=0.0)
    assert got[0] == pytest.approx(0.1) and got[10] == pytest.approx(0.05) and got[20] == pytest.approx(0.0)
    assert lrs(30, schedule="constant", warmup_steps=0, min_ratio=0.5) == [pytest.approx(0.1)] * 30
    assert lrs(6, schedule="constant", warmup_steps=4, min_ratio=0.0)[3:] == [pytest.approx(0.1)] * 3


def test_best_and_patience():
    best = Best("val_loss", "min", patience=2)
    assert best.update({"val_loss": 1.0}, 10) and best.update({"val_loss": 0.5}, 20)
    assert not best.update({"val_loss": 0.5}, 30) and not best.should_stop  # equal is not better
    assert not best.update({"val_loss": float("nan")}, 40) and best.should_stop
    assert (best.value, best.step, best.since_better) == (0.5, 20, 2)
    again = Best("val_loss", "min", patience=2)
    again.load_state_dict(best.state_dict())
    assert again.should_stop and again.value == 0.5
    high = Best("val_accuracy", "max")
    assert high.update({"val_accuracy": 0.5}, 1) and not high.update({"val_accuracy": 0.4}, 2)
    assert not high.should_stop  # patience 0: never stops


def small_loop(steps: int) -> Loop:
    """A single-process loop with an LR schedule, after `steps` optimizer steps."""
    torch.manual_seed(0)
    wl = Workload("t", None, torch.nn.Linear(4, 2), lambda out, y: ((out - y) ** 2).mean(), lambda out, y: {})
    loop = build_loop(
        wl,
        torch.device("cpu"),
        strategy_name="single",
        precision="fp32",
        optim=Optim(name="adamw", lr=0.1),
        schedule=lambda opt: schedule.build(opt, total_steps=20, schedule="cosine", warmup_steps=3),
        clip_norm=0.5,
    )
    for _ in range(steps):
        loop.step([(torch.randn(8, 4), torch.randn(8, 2))])
    return loop


def test_a_checkpoint_holds_every_part_of_the_loop_that_has_state():
    trained = small_loop(5)
    best = Best("val_loss", "min", patience=3)
    best.update({"val_loss": 0.25}, 5)
    state, shards = checkpoint_state(trained, 0, None, {"best": best})
    assert shards is None  # not fsdp: the model's and optimizer's state dicts are in `state`
    state["step"] = 5
    fresh, fresh_best = small_loop(0), Best("val_loss", "min", patience=3)
    restore(state, fresh, seed=0, env=DistEnv(), parts={"best": fresh_best})
    # every attribute of the loop with a state_dict(), found here independently of Loop.stateful()
    with_state = [name for name, value in vars(trained).items() if hasattr(value, "state_dict")]
    assert {"model", "optimizer", "scaler", "scheduler"} <= set(with_state)
    for name in with_state:
        assert repr(getattr(fresh, name).state_dict()) == repr(getattr(trained, name).state_dict()), name
    assert fresh_best.state_dict() == best.state_dict()
    assert fresh.optimizer.param_groups[0]["lr"] == trained.optimizer.param_groups[0]["lr"]
