"""A job whose validation never gives a finite value still writes its outputs: best.pt holds the
last weights, marked with the reason, and `evaluate.checkpoint: best` refuses it in one line."""

import json
import math

import pytest
import torch

from helpers import tiny_params, train_here, write_params
from scalelab.config import ConfigError, load_params
from scalelab.training import callbacks, evaluation


@pytest.mark.integration  # a training run in this process
def test_a_run_without_a_finite_validation_value_writes_its_outputs_and_best_pt_says_why(
    workdir, prepared_digits, monkeypatch
):
    nan_scores = {"loss": math.nan, "accuracy": math.nan}
    monkeypatch.setattr(callbacks, "evaluate", lambda *args, **kwargs: dict(nan_scores))
    single = {"strategy": "single", "nproc_per_node": 1, "early_stop_patience": 1}
    write_params(workdir / "p.yaml", tiny_params(train=single, tracking={"enabled": False}))
    params = load_params(workdir / "p.yaml")
    summary = train_here(params, prepared_digits, workdir / "out")
    assert summary["stop_reason"] == "early_stop" and summary["best_val_loss"] is None
    last = torch.load(workdir / "out/model.pt", weights_only=True)
    best = torch.load(workdir / "out/best.pt", weights_only=True)
    assert all(torch.equal(last["model"][k], best["model"][k]) for k in last["model"])  # the last weights
    assert best["best"]["value"] is None and "no validation gave a finite val_loss" in best["best"]["reason"]
    metrics = json.loads((workdir / "out/metrics.json").read_text())
    assert "best_val_loss" not in metrics and "best_step" not in metrics and metrics["steps"] == summary["step"]
    write_params(
        workdir / "e.yaml", tiny_params(train=single, tracking={"enabled": False}, evaluate={"checkpoint": "best"})
    )
    with pytest.raises(ConfigError, match=r"evaluate.checkpoint = 'best' is not allowed for this training: no best"):
        evaluation.run(load_params(workdir / "e.yaml"), prepared_digits, workdir / "out", workdir / "eval.json")
    assert evaluation.run(params, prepared_digits, workdir / "out", workdir / "eval.json")["num_test_samples"] > 0
