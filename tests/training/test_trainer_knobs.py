"""A cosine schedule with warm-up, clipping, the best checkpoint, early stopping and asynchronous
checkpoints in a real job: a stop and resume stays bitwise, the run records why it ended and which
step was best, and `evaluate` scores best.pt or model.pt as `evaluate.checkpoint` says."""

import json

import pytest
import torch
from mlflow import MlflowClient
from test_resume import StopAtCheck

from helpers import histories, tiny_params, train_here, write_params
from scalelab.config import load_params
from scalelab.training import evaluation
from scalelab.training.schedule import lr_factor

pytestmark = pytest.mark.integration  # training runs in this process, into a real MLflow store

PER_EPOCH = 39  # digits: 1,257 training samples in batches of 32
# mode max on a falling val_loss: the first validation stays best, and with patience 2 the job
# stops at the third (step 117 of 195) with best.pt from step 39
KNOBS = {
    "epochs": 5,
    "strategy": "single",
    "nproc_per_node": 1,
    "checkpoint_every_steps": 20,
    "async_checkpoint": True,  # written in a background thread while the next steps run
    "lr_schedule": "cosine",
    "lr_warmup_steps": 10,
    "min_lr_ratio": 0.1,
    "grad_clip_norm": 0.5,
    "best_metric": "val_loss",
    "best_mode": "max",
    "early_stop_patience": 2,
}


def weights(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow  # three training runs and two evaluations
def test_schedule_clipping_and_early_stop_resume_bitwise_and_are_recorded(workdir, store_ready, prepared_digits):
    write_params(workdir / "p.yaml", tiny_params(train=KNOBS, slurm={"stop_check_every_steps": 1}))
    params = load_params(workdir / "p.yaml")
    ref = train_here(params, prepared_digits, workdir / "ref")
    assert (ref["step"], ref["stop_reason"], ref["best_step"]) == (3 * PER_EPOCH, "early_stop", PER_EPOCH)
    assert train_here(params, prepared_digits, workdir / "pre", stop=StopAtCheck(45))["step"] == 45
    got = train_here(params, prepared_digits, workdir / "pre")
    assert (got["step"], got["stop_reason"], got["best_step"]) == (3 * PER_EPOCH, "early_stop", PER_EPOCH)
    for name in ("model.pt", "best.pt"):
        ref_w, got_w = weights(workdir / "ref" / name), weights(workdir / "pre" / name)
        assert all(torch.equal(ref_w[k], got_w[k]) for k in ref_w), name
    assert not all(torch.equal(a, b) for a, b in zip(weights(workdir / "ref/model.pt").values(), ref_w.values()))

    want, have = histories(ref["run_id"]), histories(got["run_id"])
    assert have == want  # lr and grad_norm included, bit for bit
    for step, lr in have["lr"]:  # the lr each logged step used: the formula at steps_done = step - 1
        factor = lr_factor(step - 1, total_steps=5 * PER_EPOCH, schedule="cosine", warmup_steps=10, min_ratio=0.1)
        assert lr == pytest.approx(params.train.lr * factor)
    assert any(norm > 0.5 for _, norm in have["grad_norm"])  # clipping was active (the norm is pre-clip)
    run = MlflowClient().get_run(got["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["scalelab.stop_reason"] == "early_stop"
    assert run.data.metrics["best_step"] == PER_EPOCH
    assert run.data.metrics["best_val_loss"] == pytest.approx(have["val_loss"][0][1])
    metrics = json.loads((workdir / "pre/metrics.json").read_text())
    assert metrics["best_step"] == PER_EPOCH and metrics["steps"] == 3 * PER_EPOCH

    scored = {}
    for which in ("best", "last"):
        write_params(workdir / "e.yaml", tiny_params(train=KNOBS, evaluate={"checkpoint": which}))
        scored[which] = evaluation.run(
            load_params(workdir / "e.yaml"), prepared_digits, workdir / "pre", workdir / f"eval-{which}.json"
        )
    assert scored["best"]["checkpoint_step"] == PER_EPOCH and "checkpoint_step" not in scored["last"]
    assert scored["best"]["test_loss"] != scored["last"]["test_loss"]


def test_best_metric_must_be_logged_by_validation(workdir):
    from scalelab.config import ConfigError

    write_params(workdir / "p.yaml", tiny_params(train={"best_metric": "val_perplexity"}))
    with pytest.raises(ConfigError, match="train.best_metric = 'val_perplexity' .*val_loss, val_accuracy"):
        load_params(workdir / "p.yaml")
    write_params(workdir / "p.yaml", {**tiny_params(), "train": {"warmup_steps": 3}})
    with pytest.raises(ConfigError, match="train.warmup_steps .* renamed to train.untimed_steps"):
        load_params(workdir / "p.yaml")
