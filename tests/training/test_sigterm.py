"""SIGTERM to a running 2-process job: the MLflow run ends KILLED or FAILED, never RUNNING."""

import os
import signal
import subprocess

import pytest
from mlflow import MlflowClient

from helpers import BIN, group_alive, output_tail, says_why, tiny_params, wait_for, write_params

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_sigterm_to_torchrun_ends_the_run_killed_or_failed(workdir, prepared_digits):
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train={"epochs": 500, "checkpoint_every_steps": 10, "log_every_steps": 1},
            tracking={"system_metrics_interval_s": 1},
        ),
    )
    cmd = [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "out"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with open(workdir / "train.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, start_new_session=True, stdout=log, stderr=log)
    ckpts, log = workdir / "out/checkpoints", workdir / "train.log"
    try:
        wait_for(lambda: list(ckpts.glob("step-*")), 300, "a checkpoint", proc, log=log)
        assert proc.poll() is None, output_tail(log)
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher, torchrun and both ranks, as a scheduler does
        # poll() reaps the launcher: a zombie would keep its process group alive
        wait_for(
            lambda: proc.poll() is not None and not group_alive(proc.pid),
            120,
            "every process of the job to exit",
            log=log,
        )
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    with says_why(log):
        client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
        assert len(runs) == 1
        assert runs[0].info.status in ("KILLED", "FAILED")
        steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train_loss")]
        newest = max(int(p.stem.split("-")[1]) for p in ckpts.glob("step-*"))
        assert steps == sorted(set(steps)) and steps[-1] >= newest  # flushed at the kill, no duplicates
