"""Training on the real local SLURM cluster (slurm/local/): 2 nodes x 1 task, gloo, via submitit."""

import json
import os
import subprocess
import time

import pytest
import torch
import yaml
from mlflow import MlflowClient

from helpers import BIN, run_cli, tiny_params, write_params

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
TWO_NODES = {"launcher": "slurm", "num_nodes": 2, "nproc_per_node": 1}


def sacct_states(job_id: str, env: dict, want: str, timeout_s: float = 60) -> dict[str, tuple[str, str]]:
    """{step: (state, nodelist)} once the job's own line reads `want` (accounting lags a little)."""
    deadline = time.time() + timeout_s
    while True:
        out = subprocess.run(
            ["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,NodeList"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        ).stdout
        rows = {r.split("|")[0]: tuple(r.split("|")[1:]) for r in out.strip().splitlines()}
        if rows.get(job_id, ("",))[0] == want or time.time() > deadline:
            return rows
        time.sleep(1)


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def test_dvc_repro_on_two_slurm_nodes_matches_local_torchrun(repo_copy, slurm_cluster):
    params = yaml.safe_load((repo_copy / "params.yaml").read_text())
    params.pop("speedup")
    params["train"].update(epochs=3, model={"hidden": [32], "dropout": 0.1}, **TWO_NODES)
    params["slurm"]["poll_interval_s"] = 1.0
    write_params(repo_copy / "params.yaml", params)
    stages = yaml.safe_load((repo_copy / "dvc.yaml").read_text())
    del stages["stages"]["speedup"], stages["plots"]
    (repo_copy / "dvc.yaml").write_text(yaml.safe_dump(stages, sort_keys=False))

    run_cli("dvc", "repro", cwd=repo_copy, env=slurm_cluster)
    job_id = json.loads((repo_copy / "results/train/slurm.json").read_text())["job_id"]
    rows = sacct_states(job_id, slurm_cluster, "COMPLETED")
    assert rows[job_id] == ("COMPLETED", "n[1-2]"), rows
    assert rows[f"{job_id}.0"] == ("COMPLETED", "n[1-2]"), rows  # the srun step spans both nodes

    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    run = client.get_run(json.loads((repo_copy / "results/train/run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["launch.slurm_job_id"] == job_id
    assert run.data.tags["launch.slurm_job_nodelist"] == "n[1-2]"
    assert run.data.tags["launch.submitit_folder"].endswith(job_id)
    assert "test_accuracy" in run.data.metrics
    assert "Data and pipelines are up to date" in run_cli("dvc", "repro", cwd=repo_copy, env=slurm_cluster).stdout

    local = tiny_params(train={"epochs": 3, "model": {"hidden": [32], "dropout": 0.1}}, tracking={"enabled": False})
    write_params(repo_copy / "local.yaml", local)
    run_cli("train", "--params", "local.yaml", "--data", "data/prepared", "--out", "local", cwd=repo_copy)
    slurm_w, local_w = weights(repo_copy / "results/train/model.pt"), weights(repo_copy / "local/model.pt")
    assert all(torch.equal(slurm_w[k], local_w[k]) for k in local_w)


def test_preemption_checkpoints_requeues_and_resumes_into_the_same_run(workdir, prepared_digits, slurm_cluster):
    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")  # the cluster profiles
    sections = {"train": {"epochs": 40, "checkpoint_every_steps": 50, **TWO_NODES}, "slurm": {"poll_interval_s": 1.0}}
    write_params(workdir / "params.yaml", tiny_params(**sections))
    env = {**os.environ, **slurm_cluster, "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "out"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ckpts, deadline = workdir / "out/checkpoints", time.time() + 180
    while not list(ckpts.glob("step-*.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    job_id = json.loads((workdir / "out/slurm.json").read_text())["job_id"]
    run_id = json.loads((ckpts / "job.json").read_text())["run_id"]
    subprocess.run(["scancel", "--signal=USR2", job_id], env=env, check=True)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-4000:]
    assert not (workdir / "out/model.pt").stat().st_size == 0

    history = subprocess.run(
        ["sacct", "-D", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"], env=env, capture_output=True, text=True
    ).stdout
    assert "REQUEUED" in history or "PREEMPTED" in history, history
    assert json.loads((workdir / "out/run.json").read_text())["run_id"] == run_id
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["launch.slurm_restart_count"] == "1"
    steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
    assert steps == sorted(set(range(5, steps[-1], 5)) | {steps[-1]}), steps
    assert len(client.search_runs([run.info.experiment_id])) == 1

    write_params(workdir / "local.yaml", tiny_params(train={"epochs": 40}, tracking={"enabled": False}))
    run_cli("train", "--params", "local.yaml", "--data", str(prepared_digits), "--out", "ref", cwd=workdir)
    got, ref = weights(workdir / "out/model.pt"), weights(workdir / "ref/model.pt")
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_speedup_study_cells_run_as_slurm_jobs_across_two_nodes(workdir, slurm_cluster):
    import pandas as pd
    from test_speedup import TINY

    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")
    write_params(
        workdir / "params.yaml",
        tiny_params(
            speedup={
                **TINY,
                "launcher": "slurm",
                "device": "cpu",
                "strategies": ["single", "ddp"],
                "world_sizes": [2],
                "nodes": [2],
            },
            slurm={"poll_interval_s": 1.0},
        ),
    )
    out = run_cli("speedup", "--out", "results/speedup", cwd=workdir, env=slurm_cluster).stdout
    assert "submitted 3 study cells as SLURM jobs" in out  # single-t1, single-t2, ddp-n2-w2 together
    frame = pd.read_csv(workdir / "results/speedup/speedup.csv").set_index("name")
    assert list(frame.index) == ["single-t1", "single-t2", "ddp-n2-w2"]
    assert (frame.status == "ok").all(), frame.reason.to_dict()
    assert frame.loc["ddp-n2-w2", "nodes"] == 2 and frame.loc["ddp-n2-w2", "world_size"] == 2
    assert frame.loc["ddp-n2-w2", "predicted_efficiency"] > 0  # the all-reduce ran on SLURM too
    assert "DDP, 2 processes on 2 nodes" in (workdir / "results/speedup/speedup.md").read_text()
