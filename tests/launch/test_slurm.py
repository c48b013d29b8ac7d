"""Training on the real local SLURM cluster (slurm/local/): 2 nodes x 1 task, gloo, via submitit."""

import contextlib
import json
import os
import re
import subprocess
import time
from datetime import datetime

import psutil
import pytest
import torch
import yaml
from mlflow import MlflowClient

from helpers import (
    BIN,
    histories,
    log_of,
    ok_or_busy,
    run_cli,
    says_why,
    slurm_logs,
    tiny_params,
    wait_for,
    write_params,
)
from scalelab.training.plan import read_resolved

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
TWO_NODES = {"launcher": "slurm", "num_nodes": 2, "nproc_per_node": 1}


def sacct_states(job_id: str, env: dict, want: str, timeout_s: float = 60) -> dict[str, tuple[str, str]]:
    """{step: (state, nodelist)} once the job's own state starts with `want` (accounting lags a little)."""
    seen: dict[str, str] = {"sacct": ""}

    def rows() -> dict[str, tuple[str, ...]] | None:
        seen["sacct"] = subprocess.run(
            ["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,NodeList"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        ).stdout
        found = {r.split("|")[0]: tuple(r.split("|")[1:]) for r in seen["sacct"].strip().splitlines()}
        return found if found.get(job_id, ("",))[0].startswith(want) else None

    what = f"job {job_id} {want} in SLURM's accounting"
    return wait_for(rows, timeout_s, what, log=log_of("sacct", lambda: seen["sacct"]), poll_s=1)


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


def launch_train(workdir, prepared_digits, env, **popen) -> subprocess.Popen:
    """`scalelab train --data PREPARED --out out` in `workdir` (params.yaml there), in the background."""
    cmd = [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "out"]
    return subprocess.Popen(cmd, cwd=workdir, env=env, text=True, **popen)


def json_key(path, key: str):
    """`key` of the JSON file `path` (written atomically), or None while there is no file."""
    return json.loads(path.read_text()).get(key) if path.is_file() else None


def test_preemption_checkpoints_requeues_and_resumes_into_the_same_run(workdir, prepared_digits, slurm_cluster):
    # USR2 goes out as soon as step 50's checkpoint is on disk, so the stop lands at 51..74, inside
    # an open logging window (log every 25), unless the signal takes 24+ steps to arrive (steps take
    # ~5 ms; the stop step is printed). Every checkpoint is kept: the one off the 50s is the stop.
    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")  # the cluster profiles
    train = {"epochs": 40, "log_every_steps": 25, "checkpoint_every_steps": 50, "keep_checkpoints": 100}
    write_params(workdir / "params.yaml", tiny_params(train={**train, **TWO_NODES}, slurm={"poll_interval_s": 1.0}))
    env = {**os.environ, **slurm_cluster, "PATH": f"{BIN}:{os.environ['PATH']}"}
    log_path = workdir / "train.log"  # `scalelab train` streams the SLURM job's output here
    with open(log_path, "w") as log:
        proc = launch_train(workdir, prepared_digits, env, stdout=log, stderr=subprocess.STDOUT)
    ckpts = workdir / "out/checkpoints"
    wait_for(lambda: list(ckpts.glob("step-*")), 180, "first checkpoint", proc, log=[log_path, slurm_logs(workdir)])
    job_id = json.loads((workdir / "out/slurm.json").read_text())["job_id"]
    run_id = json.loads((ckpts / "job.json").read_text())["run_id"]
    subprocess.run(["scancel", "--signal=USR2", job_id], env=env, check=True)
    with says_why([log_path, slurm_logs(workdir)]):
        proc.wait(timeout=600)
        assert proc.returncode == 0
    assert not (workdir / "out/model.pt").stat().st_size == 0

    history = subprocess.run(
        ["sacct", "-D", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"], env=env, capture_output=True, text=True
    ).stdout
    assert "REQUEUED" in history or "PREEMPTED" in history, history
    assert json.loads((workdir / "out/run.json").read_text())["run_id"] == run_id
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["launch.slurm_restart_count"] == "1"
    assert len(client.search_runs([run.info.experiment_id])) == 1

    _, plan = read_resolved(workdir / "out/resolved.json")
    total, per_epoch, every = plan.total_steps, plan.steps_per_epoch, train["log_every_steps"]
    saved = sorted(int(p.stem.removeprefix("step-")) for p in ckpts.glob("step-*"))
    stops = sorted(set(saved) - {*range(50, total + 1, 50), total})
    assert len(stops) <= 1 and all(50 < s < total for s in stops), saved
    where = f"step {stops[0]}, {stops[0] % every} steps into a logging window" if stops else "a multiple of 50"
    print(f"preempted at {where} (log every {every}, {total} steps)")

    have = histories(run_id, uri)
    logged = {"train_loss", "lr", "grad_norm", "val_loss", "val_accuracy", "ranks_in_sync"}
    assert set(have) == logged | {"best_step", "best_val_loss"}, sorted(have)
    steps = {key: [s for s, _ in rows] for key, rows in have.items()}  # sorted: a step twice shows up twice
    assert steps["train_loss"] == sorted({*range(every, total + 1, every), total}), steps["train_loss"]
    assert steps["lr"] == steps["grad_norm"] == steps["train_loss"], steps
    assert steps["val_loss"] == steps["val_accuracy"] == list(range(per_epoch, total + 1, per_epoch)), steps
    assert steps["ranks_in_sync"] == [total], steps

    # the same job, uninterrupted, on this machine (2 ranks under torchrun), tracked in its own store
    ref_params = tiny_params(train={**train, "num_nodes": 1, "nproc_per_node": 2})
    write_params(workdir / "local.yaml", ref_params)
    ref_uri = f"sqlite:///{workdir / 'ref.db'}"
    ref_env = {"MLFLOW_TRACKING_URI": ref_uri}
    run_cli("train", "--params", "local.yaml", "--data", str(prepared_digits), "--out", "ref", cwd=workdir, env=ref_env)
    ref_run = json.loads((workdir / "ref/run.json").read_text())["run_id"]
    assert have == histories(ref_run, ref_uri)  # every step and value, bit for bit
    got, ref = weights(workdir / "out/model.pt"), weights(workdir / "ref/model.pt")
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def the_error_line(stderr_file, proc) -> str:
    """`scalelab train` exited 1 with one error line; that line, up to its log path (which holds
    the test's folder name)."""
    stderr = stderr_file.read_text()
    assert proc.returncode == 1, stderr[-3000:]  # 1: a failed job (scalelab.cli)
    errors = [ln for ln in stderr.splitlines() if ln.startswith("scalelab train: error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0].split("; logs: ")[0]


def test_scancel_of_a_train_job_says_cancelled_and_closes_the_run(workdir, prepared_digits, slurm_cluster):
    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")  # the cluster profiles
    train = {"epochs": 5000, "checkpoint_every_steps": 1000, **TWO_NODES}  # ~95k steps: minutes of work
    write_params(workdir / "params.yaml", tiny_params(train=train, slurm={"poll_interval_s": 0.5}))
    env = {**os.environ, **slurm_cluster, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with open(workdir / "train.out", "w") as out, open(workdir / "train.err", "w") as err:
        proc = launch_train(workdir, prepared_digits, env, stdout=out, stderr=err)
    job_id, logs = None, [workdir / "train.err", slurm_logs(workdir)]
    try:
        job_id = wait_for(lambda: json_key(workdir / "out/slurm.json", "job_id"), 180, "a job id", proc, log=logs)
        run_id = wait_for(
            lambda: json_key(workdir / "out/checkpoints/job.json", "run_id"), 180, "an MLflow run", proc, log=logs
        )
        with says_why(logs):
            squeue = ["squeue", "-h", "-j", job_id, "-o", "%T"]
            state = subprocess.run(squeue, env=env, capture_output=True, text=True).stdout.strip()
            assert state == "RUNNING", state
            client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
            assert client.get_run(run_id).info.status == "RUNNING"
            subprocess.run(["scancel", job_id], env=env, check=True)
            proc.wait(timeout=120)
    finally:
        if proc.poll() is None:  # a failed assertion: leave no job behind
            proc.kill()
            if job_id:
                subprocess.run(["scancel", job_id], env=env)
    with says_why(logs):
        said = the_error_line(workdir / "train.err", proc)
        assert "cancelled" in said and f"SLURM job {job_id} " in said, said
        assert client.get_run(run_id).info.status in ("KILLED", "FAILED")
        assert sacct_states(job_id, env, "CANCELLED")[job_id][0].startswith("CANCELLED")


def test_speedup_study_cells_run_as_slurm_jobs_across_two_nodes(workdir, slurm_cluster):
    import pandas as pd

    from helpers import TINY_STUDY as TINY

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
    assert ok_or_busy(frame), frame.reason.to_list()
    assert frame.loc["ddp-n2-w2", "nodes"] == 2 and frame.loc["ddp-n2-w2", "world_size"] == 2
    assert frame.loc["ddp-n2-w2", "predicted_efficiency"] > 0  # the all-reduce ran on SLURM too
    assert "DDP, 2 processes on 2 nodes" in (workdir / "results/speedup/speedup.md").read_text()
    # the two nodes as SLURM's accounting saw them, not as the CSV says
    ddp_job = re.search(r"study cells as SLURM jobs ([\d, ]+)", out).group(1).split(", ")[2]
    state, nodes = sacct_states(ddp_job, slurm_cluster, "COMPLETED")[ddp_job]
    assert state == "COMPLETED" and nodes == "n[1-2]", (ddp_job, state, nodes)


def job_start(job_id: str, env: dict) -> float:
    """When SLURM started the job (its time limit counts from then), as a Unix time."""
    squeue = ["squeue", "-h", "-j", job_id, "-o", "%S"]
    out = subprocess.run(squeue, env=env, capture_output=True, text=True, check=True).stdout
    return datetime.fromisoformat(out.strip()).timestamp()  # local time, as SLURM prints it


def job_tasks(workdir) -> list[psutil.Process]:
    """The job's task processes (submitit's, one per rank, started by slurmd) and their children."""
    tasks = [
        p for p in psutil.process_iter(["cmdline"])
        if "submitit.core._submit" in (p.info["cmdline"] or []) and str(workdir) in " ".join(p.info["cmdline"])
    ]  # fmt: skip
    assert tasks, f"no task process of the job in {workdir}"
    return [q for p in tasks for q in (p, *p.children(recursive=True))]


def pause_until(procs: list[psutil.Process], until: float) -> None:
    """SIGSTOPs `procs` until the Unix time `until` (a job waiting for SLURM's clock need not burn
    two cores meanwhile), then SIGCONTs them."""
    try:
        for p in procs:
            p.suspend()
        time.sleep(max(0.0, until - time.time()))
    finally:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()


def test_a_job_past_its_time_limit_ends_its_run_killed_not_running(workdir, prepared_digits, slurm_cluster):
    # What happens here: slurmctld checks time limits every 30 s, so USR2 (signal_delay_s 30 before
    # the 2 min limit) comes 90-120 s in, always one check before the job is ended (120-150 s in).
    # Every rank stops at a step boundary and checkpoints; submitit finds the job timed out with no
    # requeue left (max_timeouts 0), so rank 0 raises; rank 1 waits; slurmctld ends the job. The job
    # has 90 s to start and open its run first: CI once took over 30 s with a 1 min limit (the
    # signal came before the run, and the test could not check it). Once it has a checkpoint, its
    # processes are paused until 80 s in, so the wait costs no CPU. ~380k steps cannot finish.
    profile = yaml.safe_load((BIN.parents[1] / "slurm/profiles/local.yaml").read_text())
    (workdir / "slurm/profiles").mkdir(parents=True)
    write_params(workdir / "slurm/profiles/short.yaml", {**profile, "time_limit_min": 2, "signal_delay_s": 30})
    train = {"epochs": 20000, "checkpoint_every_steps": 1000, **TWO_NODES}  # est. 20 s a checkpoint < 120 - 30 s
    slurm = {"profile": "short", "max_timeouts": 0, "est_step_time_s": 0.02, "poll_interval_s": 0.5}
    write_params(workdir / "params.yaml", tiny_params(train=train, slurm=slurm))
    env = {**os.environ, **slurm_cluster, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with open(workdir / "train.out", "w") as out, open(workdir / "train.err", "w") as err:
        proc = launch_train(workdir, prepared_digits, env, stdout=out, stderr=err)
    job_id, logs = None, [workdir / "train.err", slurm_logs(workdir)]
    try:
        job_id = wait_for(lambda: json_key(workdir / "out/slurm.json", "job_id"), 180, "a job id", proc, log=logs)
        run_id = wait_for(
            lambda: json_key(workdir / "out/checkpoints/job.json", "run_id"), 180, "an MLflow run", proc, log=logs
        )
        ckpts = workdir / "out/checkpoints"
        wait_for(lambda: list(ckpts.glob("step-*")), 180, "a first checkpoint", proc, log=logs)
        with says_why(logs):
            pause_until(job_tasks(workdir), job_start(job_id, env) + 80)  # idle, not spinning, until the signal nears
            proc.wait(timeout=300)
    finally:
        if proc.poll() is None:  # a failed assertion: leave no job behind
            proc.kill()
            if job_id:
                subprocess.run(["scancel", job_id], env=env)
    with says_why(logs):
        said = the_error_line(workdir / "train.err", proc)
        assert f"SLURM job {job_id} hit its 2 min time limit" in said and "slurm.max_timeouts = 0" in said, said
        assert sacct_states(job_id, env, "TIMEOUT")[job_id][0] == "TIMEOUT"
        history = subprocess.run(
            ["sacct", "-D", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        assert "REQUEUED" not in history and "PREEMPTED" not in history, history  # no requeue was left
        run = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}").get_run(run_id)
        assert run.info.status == "KILLED", run.info.status  # never RUNNING
        assert list(ckpts.glob("step-*")), "no checkpoint for a rerun to resume from"
