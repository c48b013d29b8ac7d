"""A diverging run stops at its next logging window, FAILED, and never checkpoints bad weights."""

import pytest
import torch
from mlflow import MlflowClient

from helpers import tiny_params, train_here, write_params
from scalelab.config import load_params
from scalelab.tracking import tracking_uri
from scalelab.training.job import NonFiniteLossError


@pytest.mark.integration  # training runs in this process, into a real MLflow store
@pytest.mark.parametrize("checkpoint_every", [1, 3])  # every step, and between logging windows
def test_non_finite_loss_fails_the_run_and_keeps_only_finite_checkpoints(
    workdir, store_ready, prepared_digits, checkpoint_every
):
    write_params(
        workdir / "p.yaml",
        tiny_params(
            train={
                "strategy": "single",
                "nproc_per_node": 1,
                "optimizer": "sgd",
                "lr": 1e20,
                "log_every_steps": 5,
                "checkpoint_every_steps": checkpoint_every,
            },
            tracking={"system_metrics_interval_s": 0},
        ),
    )
    with pytest.raises(NonFiniteLossError, match=r"train_loss = (nan|inf) at step \d+ is not finite"):
        train_here(load_params(workdir / "p.yaml"), prepared_digits, workdir / "out")
    client = MlflowClient(tracking_uri())
    run = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])[0]
    assert run.info.status == "FAILED"
    for path in (workdir / "out/checkpoints").glob("step-*.pt"):
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(t).all() for t in state["weights"]["model"].values()), path.name
    assert not (workdir / "out/model.pt").exists()
