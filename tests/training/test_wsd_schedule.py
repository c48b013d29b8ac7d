"""train.lr_schedule: wsd: a linear warm-up, the lr held stable, then a linear decay to lr *
min_lr_ratio over the last train.lr_decay_fraction of the steps after the warm-up; its fraction is
validated, and `dvc exp run -S train.lr_schedule=wsd` trains along that curve."""

import json
import re

import pytest
from mlflow import MlflowClient

from helpers import run_cli, tiny_params, training_pipeline
from scalelab.config import ConfigError, parse_params
from scalelab.training.schedule import lr_factor


def curve(total, warmup, fraction, min_ratio):
    return [
        lr_factor(
            k, total_steps=total, schedule="wsd", warmup_steps=warmup, min_ratio=min_ratio, decay_fraction=fraction
        )
        for k in range(total)
    ]


def test_wsd_warms_up_holds_then_decays_linearly_over_its_fraction():
    f = curve(100, 10, 0.2, 0.1)  # 89 steps after the warm-up's 10 (and the first): decay over the last 17.8
    assert f[:10] == pytest.approx([(k + 1) / 10 for k in range(10)])
    assert f[10:82] == [1.0] * 72  # stable up to progress 0.8: step 10 + 0.8 * 89 = 81.2
    decay = f[81:]
    assert all(a > b for a, b in zip(decay, decay[1:]))  # falls at every step of the decay
    steps = [b - a for a, b in zip(decay[1:], decay[2:])]
    assert steps == pytest.approx([steps[0]] * len(steps))  # linearly
    assert f[-1] == pytest.approx(0.1)  # min_lr_ratio at the last step
    assert curve(100, 10, 1.0, 0.0)[10:] == pytest.approx(
        [lr_factor(k, total_steps=100, schedule="linear", warmup_steps=10, min_ratio=0.0) for k in range(10, 100)]
    )  # the whole span decaying: the linear schedule


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5])
def test_a_decay_fraction_outside_0_1_is_refused_naming_the_key(fraction):
    with pytest.raises(ConfigError, match=re.escape(f"train.lr_decay_fraction = {float(fraction)!r} is not allowed")):
        parse_params(tiny_params(train={"lr_schedule": "wsd", "lr_decay_fraction": fraction}), "params.yaml")


@pytest.mark.slow
@pytest.mark.integration  # dvc exp run of validate, prepare, train and evaluate in a copy of the repo
def test_dvc_exp_run_with_wsd_trains_along_the_curve(repo_copy):
    train = {"strategy": "single", "nproc_per_node": 1, "epochs": 2, "log_every_steps": 1, "lr": 0.01}
    training_pipeline(repo_copy, tiny_params(train=train, tracking={"system_metrics_interval_s": 0}), commit=True)
    settings = ["train.lr_schedule=wsd", "train.lr_warmup_steps=5", "train.lr_decay_fraction=0.5"]
    run_cli("dvc", "exp", "run", *(a for s in settings for a in ("-S", s)), "-S", "train.min_lr_ratio=0.1",
            cwd=repo_copy, timeout=900)  # fmt: skip
    run_id = json.loads((repo_copy / "results/train/run.json").read_text())["run_id"]
    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    assert client.get_run(run_id).data.params["train.lr_schedule"] == "wsd"
    lrs = [m.value for m in sorted(client.get_metric_history(run_id, "lr"), key=lambda m: m.step)]
    total = len(lrs)
    assert total > 40, total
    assert lrs == pytest.approx([0.01 * f for f in curve(total, 5, 0.5, 0.1)], rel=1e-6)
