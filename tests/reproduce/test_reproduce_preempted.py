"""`scalelab reproduce` of a preempted FSDP run: SIGTERM to `dvc repro` during train (a scheduler's
preemption), the rerun resumes into the same MLflow run, and one uninterrupted reproduction matches
its every param, metric step and the final weights.

The run is FSDP's (2 gloo processes), so this is also the test that `reproduce` matches an FSDP
run end to end (it was a test of its own in tests/training/test_fsdp.py); DDP's reproduce is in
test_reproduce.py."""

import json
import os
import signal
import subprocess

import pytest
from mlflow import MlflowClient

from helpers import (
    BIN,
    output_tail,
    process_tree,
    record_reliability,
    run_cli,
    says_why,
    tiny_params,
    training_pipeline,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# the SIGTERM lands a few steps after the first checkpoint (7), long before the first logging step
# (100): the resume restores a half-filled logging window that no earlier try has logged. 8 epochs
# (152 steps) log one full window and a last part one, as more epochs would, at 2/5 of their cost
EPOCHS, LOG_EVERY, CHECKPOINT_EVERY = 8, 100, 7
TOTAL = EPOCHS * 19  # digits: 19 global batches of 64 per epoch


def checkpoint_steps(repo):
    return sorted(int(p.stem.split("-")[1]) for p in (repo / "results/train/checkpoints").glob("step-*"))


def train_runs(client):
    exp = client.get_experiment_by_name("scalelab")
    return client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'train'")


def test_reproduce_of_a_preempted_run_matches(repo_copy):
    train = {
        "strategy": "fsdp",
        "epochs": EPOCHS,
        "log_every_steps": LOG_EVERY,
        "checkpoint_every_steps": CHECKPOINT_EVERY,
    }
    training_pipeline(repo_copy, tiny_params(train=train, tracking={"system_metrics_interval_s": 0}), commit=True)
    log_path = repo_copy.parent / "preempted.log"
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "dvc"), "repro"], cwd=repo_copy, env=env, stdout=log, stderr=log, start_new_session=True
        )
    procs = []
    try:
        wait_for(lambda: checkpoint_steps(repo_copy), 300, "a checkpoint", proc, log=log_path)
        assert proc.poll() is None, output_tail(log_path)
        procs = process_tree(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)  # dvc, scalelab train and torchrun; torchrun stops the ranks
        with says_why(log_path):
            proc.wait(timeout=60)
        wait_for(
            lambda: not any(p.is_running() for p in procs), 120, "every process of the pipeline to end", log=log_path
        )
    finally:
        for p in procs:
            if p.is_running():
                p.kill()
    with says_why(log_path):
        resumed = checkpoint_steps(repo_copy)[-1]
        assert 0 < resumed < TOTAL, resumed
        assert resumed % LOG_EVERY != 0, resumed

        client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
        (run,) = train_runs(client)
        assert run.info.status in ("KILLED", "FAILED")
        logged = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert not logged, f"the SIGTERM came after step {logged[-1]}: no open logging window is resumed"

    out = run_cli("dvc", "repro", cwd=repo_copy, timeout=900)
    text = out.stdout + out.stderr
    assert "Running stage 'train'" in text and "Running stage 'evaluate'" in text, text[-3000:]
    assert f"| {resumed}/{TOTAL} [" in text, text[-3000:]  # the progress bar starts at the checkpoint
    (after,) = train_runs(client)  # resumed into the same run, no second one
    assert after.info.run_id == run.info.run_id and after.info.status == "FINISHED"
    assert after.data.tags["scalelab.strategy"] == "fsdp"
    assert json.loads((repo_copy / "results/train/run.json").read_text())["run_id"] == run.info.run_id
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == [*range(LOG_EVERY, TOTAL, LOG_EVERY), TOTAL], steps  # each step once, and the last

    # no --yes: the run's only recorded diff is the untracked dvc.lock, which is not code
    rep = run_cli("reproduce", run.info.run_id, cwd=repo_copy, check=False, timeout=900)
    print(rep.stdout)  # the table, shown with `pytest -rP`
    assert rep.returncode == 0 and "RESULT: match" in rep.stdout, rep.stdout + rep.stderr[-3000:]
    rows = {line.split("  ")[0]: line for line in rep.stdout.splitlines()}
    for metric in ("train_loss", "val_loss", "val_accuracy", "test_accuracy", "ranks_in_sync"):
        row = next(v for k, v in rows.items() if k.startswith(f"metric {metric} "))
        assert row.endswith("match"), row
    assert rows["weights sha256"].endswith("match"), rows["weights sha256"]
    record_reliability(
        "preempted_reproduce",
        {
            "resumed_from_step": resumed,
            "log_every_steps": LOG_EVERY,
            "reproduce_matched": True,
        },
    )
