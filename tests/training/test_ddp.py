"""2-process gloo runs through the real CLI and torchrun: sync, determinism, resume after SIGKILL."""

import json
import os
import signal
import subprocess

import pytest
import torch
from mlflow import MlflowClient

from helpers import BIN, output_tail, process_tree, run_cli, signal_all, tiny_params, wait_for, write_params

pytestmark = pytest.mark.distributed


def train(workdir, data_dir, out="results/train", **sections):
    write_params(workdir / "params.yaml", tiny_params(**sections))
    run_cli("train", "--params", "params.yaml", "--data", str(data_dir), "--out", out, cwd=workdir)
    return workdir / out


def weights(out_dir):
    return torch.load(out_dir / "model.pt", weights_only=True)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_ddp_ranks_end_with_identical_weights(workdir, prepared_digits):
    out = train(workdir, prepared_digits, tracking={"enabled": False})
    run = json.loads((out / "run.json").read_text())
    assert len(run["rank_weight_sha256"]) == 2
    assert len(set(run["rank_weight_sha256"])) == 1
    assert json.loads((out / "metrics.json").read_text())["ranks_in_sync"] == 1.0


@pytest.mark.slow  # three training jobs
def test_same_seed_gives_bitwise_identical_weights(workdir, prepared_digits):
    a = train(workdir, prepared_digits, out="a", tracking={"enabled": False})
    b = train(workdir, prepared_digits, out="b", tracking={"enabled": False})
    assert_same_weights(weights(a), weights(b))
    c = train(workdir, prepared_digits, out="c", tracking={"enabled": False}, train={"seed": 1})
    assert not torch.equal(weights(a)["1.weight"], weights(c)["1.weight"])


@pytest.mark.slow  # two training jobs
def test_grad_accumulation_with_no_sync_matches_large_batch(workdir, prepared_digits):
    base = {"model": {"hidden": [32], "dropout": 0.0}, "optimizer": "sgd", "lr": 0.05}
    big = train(workdir, prepared_digits, out="big", tracking={"enabled": False}, train={**base, "batch_size": 32})
    acc = train(
        workdir,
        prepared_digits,
        out="acc",
        tracking={"enabled": False},
        train={**base, "batch_size": 16, "grad_accum_steps": 2},
    )
    for key, value in weights(big).items():
        torch.testing.assert_close(weights(acc)[key], value, rtol=1e-4, atol=1e-5)


def sigkill_after_first_checkpoint(workdir, prepared_digits, sections):
    """Starts `scalelab train --out killed` with `sections`, SIGKILLs every process of the job once
    a checkpoint exists; returns (the checkpoint folder, the run id the killed job recorded)."""
    write_params(workdir / "params.yaml", tiny_params(**sections))
    cmd = [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "killed"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    log = workdir / "killed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, start_new_session=True, stdout=out, stderr=out)
    ckpts = workdir / "killed" / "checkpoints"
    wait_for(lambda: list(ckpts.glob("step-*")), 120, "the first checkpoint", proc, log=log, poll_s=0.02)
    # the launcher and the ranks: torchrun starts each rank in a session of its own, where a signal
    # to the launcher's group does not reach it (left alone, a rank stops itself within a second,
    # runtime.lifeline, and saves what a SIGTERM saves, maybe while the folder is read below)
    job = process_tree(proc.pid)
    signal_all(job, signal.SIGKILL)
    proc.wait()
    # a rank inside a system call (a rename that commits a checkpoint) finishes it before it dies:
    # what is on disk is settled once every process of the job is gone
    wait_for(lambda: not any(p.is_running() for p in job), 60, "the killed job's processes to exit", log=log)
    assert list(ckpts.glob("step-*")), f"no checkpoint appeared before the kill{output_tail(log)}"
    assert not (workdir / "killed" / "model.pt").exists(), f"the run finished before the kill{output_tail(log)}"
    run_id_before = json.loads((ckpts / "job.json").read_text())["run_id"]
    return ckpts, run_id_before


@pytest.mark.slow  # three training jobs, one killed
def test_sigkill_then_resume_matches_uninterrupted_run(workdir, prepared_digits):
    sections = {"train": {"epochs": 12, "checkpoint_every_steps": 20}}
    ref = train(workdir, prepared_digits, out="ref", tracking={"enabled": False}, **sections)

    ckpts, run_id_before = sigkill_after_first_checkpoint(workdir, prepared_digits, sections)

    run_cli("train", "--data", str(prepared_digits), "--out", "killed", cwd=workdir)
    assert_same_weights(weights(ref), weights(workdir / "killed"))

    run_id = json.loads((workdir / "killed" / "run.json").read_text())["run_id"]
    assert run_id == run_id_before
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
    assert steps == sorted(set(steps)), "duplicate or unordered metric steps after resume"
    assert steps == sorted(set(range(5, steps[-1], 5)) | {steps[-1]}), "gaps in the metric steps"
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert len(runs) == 1
