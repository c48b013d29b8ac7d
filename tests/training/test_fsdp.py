"""train.strategy fsdp (FSDP2, 2 gloo processes) through the real CLI and torchrun: the same math as
one process and as ddp, grad accumulation, resume after SIGKILL, full-state checkpoints.

`dvc repro` then `scalelab reproduce` of an FSDP run (preempted and resumed, too) is
tests/reproduce/test_reproduce_preempted.py."""

import json

import pytest
import torch
from mlflow import MlflowClient
from test_ddp import assert_same_weights, sigkill_after_first_checkpoint, train, weights

from helpers import run_cli

pytestmark = pytest.mark.distributed

FSDP = {"strategy": "fsdp"}
# no dropout (its masks differ per rank), plain sgd: the math of one global batch, however it is split
EXACT = {"model": {"hidden": [32], "dropout": 0.0}, "optimizer": "sgd", "lr": 0.05}


EPOCHS = 6  # the resume test: the first checkpoint (step 20) comes mid-epoch, long before the end
TOTAL = EPOCHS * 19  # digits: 19 global batches of 64 per epoch


def assert_close_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.slow  # four training jobs
def test_fsdp_matches_one_process_and_ddp_and_accumulates_gradients(workdir, prepared_digits):
    # DistributedSampler deals one shuffled order round-robin: at every step the 2 ranks' batches of
    # B together are exactly the one process's batch of 2B, so the runs differ only in float rounding
    # (mean of two half-batch means vs one mean): within tolerance, not bitwise. fsdp and ddp do the
    # same reductions on the same values: bitwise equal.
    steps = {}

    def run(out, **train_section):
        folder = train(workdir, prepared_digits, out=out, tracking={"enabled": False}, train=train_section)
        steps[out] = json.loads((folder / "metrics.json").read_text())["steps"]
        return weights(folder)

    single = run("single", **EXACT, strategy="single", nproc_per_node=1, batch_size=64)
    fsdp = run("fsdp", **EXACT, **FSDP, batch_size=32)
    ddp = run("ddp", **EXACT, strategy="ddp", batch_size=32)
    acc = run("acc", **EXACT, **FSDP, batch_size=16, grad_accum_steps=2)  # strategy.no_sync's FSDP path

    assert set(steps.values()) == {38}, steps  # digits: 2 epochs x 19 global batches of 64
    assert_close_weights(fsdp, single)
    assert_same_weights(fsdp, ddp)
    assert_close_weights(acc, single)


@pytest.mark.slow  # three training jobs, one killed
def test_fsdp_sigkill_then_resume_matches_uninterrupted_run(workdir, prepared_digits):
    sections = {"train": {**FSDP, "epochs": EPOCHS, "checkpoint_every_steps": 20}}
    ref = train(workdir, prepared_digits, out="ref", tracking={"enabled": False}, **sections)

    ckpts, run_id_before = sigkill_after_first_checkpoint(workdir, prepared_digits, sections)

    resumed = max(int(p.stem.split("-")[1]) for p in ckpts.glob("step-*.pt"))

    rerun = run_cli("train", "--data", str(prepared_digits), "--out", "killed", cwd=workdir)
    # from the checkpoint, not from scratch (which would give the same weights too)
    assert f"| {resumed}/{TOTAL} [" in rerun.stderr, rerun.stderr[-3000:]
    assert_same_weights(weights(ref), weights(workdir / "killed"))

    run_id = json.loads((workdir / "killed" / "run.json").read_text())["run_id"]
    assert run_id == run_id_before
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.tags["scalelab.strategy"] == "fsdp"
    steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
    assert steps == sorted(set(steps)), "duplicate or unordered metric steps after resume"
    assert steps == sorted(set(range(5, steps[-1], 5)) | {steps[-1]}), "gaps in the metric steps"
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert len(runs) == 1


def test_fsdp_checkpoint_holds_the_full_unsharded_state(workdir, prepared_digits):
    from scalelab.training import workloads

    out = train(
        workdir,
        prepared_digits,
        out="ckpt",
        tracking={"enabled": False},
        train={**FSDP, "epochs": 1, "model": {"hidden": [32], "dropout": 0.1}, "optimizer": "sgd", "momentum": 0.9},
    )
    manifest = json.loads((prepared_digits / "manifest.json").read_text())
    plain = workloads.load(
        "mlp", {"hidden": [32]}, input_shape=manifest["input_shape"], num_classes=manifest["num_classes"]
    ).model.state_dict()
    assert plain["1.weight"].shape == (32, 64)

    paths = sorted((out / "checkpoints").glob("step-*.pt"))
    assert paths, "no checkpoint written"
    state = torch.load(paths[-1], map_location="cpu", weights_only=True)
    model = state["model"]
    assert {k: tuple(v.shape) for k, v in model.items()} == {k: tuple(v.shape) for k, v in plain.items()}
    assert all(type(v) is torch.Tensor for v in model.values()), {k: type(v) for k, v in model.items()}
    assert_same_weights(model, weights(out))  # the last checkpoint is the final step

    optim = state["optimizer"]
    params = {k for k in plain}  # the mlp has no buffers: every entry is a parameter
    assert {p for group in optim["param_groups"] for p in group["params"]} == params, optim["param_groups"]
    assert set(optim["state"]) == params, optim["state"].keys()
    for name, entry in optim["state"].items():
        buf = entry["momentum_buffer"]
        assert type(buf) is torch.Tensor and buf.shape == plain[name].shape, (name, type(buf), buf.shape)
        assert buf.abs().sum() > 0, name
