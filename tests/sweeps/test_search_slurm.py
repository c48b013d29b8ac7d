"""A search on the local SLURM cluster: TPE with the median pruner over a job array of 2 workers;
a worker cancelled with scancel loses its trial (failed, replaced within the budget); a
preempted worker (USR2) resumes the same trial in the same run."""

import json
import os
import subprocess

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from helpers import (
    BIN,
    log_of,
    output_tail,
    run_cli,
    says_why,
    slurm_logs,
    slurm_queued,
    tiny_params,
    wait_for,
    write_params,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.slow]
ONE_TASK = {"launcher": "slurm", "num_nodes": 1, "nproc_per_node": 1, "optimizer": "sgd"}


def study_of(folder):
    from scalelab.training.pruning import open_storage

    return optuna.load_study(study_name=folder.name, storage=open_storage(str(folder / "optuna.journal")))


def start_submit(workdir, data, env, name, *args) -> subprocess.Popen:
    """`scalelab sweep submit` in the background (its output in `submit_log(workdir, name)`'s two
    files), with the cluster profiles."""
    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")
    cmd = [str(BIN / "scalelab"), "sweep", "submit", "--name", name, "--data", str(data), *args]
    full_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env}
    out_path, err_path = submit_log(workdir, name)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        return subprocess.Popen(cmd, cwd=workdir, env=full_env, stdout=out, stderr=err, text=True)


def submit_log(workdir, name):
    """The stdout and stderr files of search `name`'s `sweep submit`."""
    return workdir / f"submit-{name}.out", workdir / f"submit-{name}.err"


def submitted(workdir, proc: subprocess.Popen, name: str) -> None:
    with says_why(submit_log(workdir, name)):
        proc.wait(timeout=120)
    out = submit_log(workdir, name)[0].read_text()
    assert proc.returncode == 0 and f"submitted search {name!r}" in out, output_tail(submit_log(workdir, name))


def submit(workdir, data, env, name, *args):
    submitted(workdir, start_submit(workdir, data, env, name, *args), name)
    return json.loads((workdir / "results/sweeps" / name / "manifest.json").read_text())


def collect_until_done(workdir, env, name, timeout_s=600, jobs=()):
    """`sweep collect` until the parent run is finished (the budget spent); the last summary. With
    `jobs`, the first collect waits until they have all left the queue."""
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    parent = json.loads((workdir / "results/sweeps" / name / "manifest.json").read_text())["parent_run_id"]
    summary = workdir / "results/sweeps" / name / "summary.csv"
    if jobs:
        wait_for(lambda: not slurm_queued(list(jobs), env), timeout_s, "the workers to end", log=slurm_logs(workdir))

    def collected() -> bool:
        run_cli("sweep", "collect", "--name", name, cwd=workdir, env=env)
        return client.get_run(parent).info.status == "FINISHED"

    wait_for(collected, timeout_s, "the search's budget to be spent", log=[summary, slurm_logs(workdir)], poll_s=3)
    return pd.read_csv(summary), client, client.get_run(parent)


def test_tpe_with_median_pruning_on_a_job_array(workdir, prepared_digits, slurm_cluster):
    # lr from 1e-5 (learns slowly) to 1.0 (near divergence) with sgd, 3 validations per trial: the
    # median pruner stops trials below the median of the finished ones at the same validation
    params = tiny_params(train={**ONE_TASK, "epochs": 3}, tracking={"system_metrics_interval_s": 0})
    write_params(workdir / "params.yaml", params)
    manifest = submit(
        workdir, prepared_digits, slurm_cluster, "tpe", "--method", "tpe", "--trials", "8", "--parallel", "2",
        "--pruner", "median", "--objective", "val_loss:min", "-S", "train.lr=loguniform(1e-5,1.0)",
    )  # fmt: skip
    assert len({e["job_id"].split("_")[0] for e in manifest["elements"]}) == 1 and len(manifest["elements"]) == 2

    jobs = [e["job_id"] for e in manifest["elements"]]
    # submit returned while the array was still queued or running: it does not wait for the search
    # (an event, not a time limit: under load the submit itself may take a minute; as test_sweep.py)
    # (the trials' count is no proof: eight small trials may all end while the elements are still queued)
    assert slurm_queued(jobs, slurm_cluster)
    summary, client, parent = collect_until_done(workdir, slurm_cluster, "tpe", jobs=jobs)
    print(summary.to_string())  # shown with `pytest -rP`
    assert len(summary) == 8 and sorted(summary.trial) == list(range(8)), summary.to_string()
    assert set(summary.state) <= {"finished", "pruned", "failed"}
    pruned = summary[summary.state == "pruned"]
    assert len(pruned) >= 1, summary.to_string()
    study = study_of(workdir / "results/sweeps/tpe")
    assert len(study.trials) == 8
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(int(c.data.tags["scalelab.trial"]) for c in children) == list(range(8))
    for child in children:
        row = summary[summary.trial == int(child.data.tags["scalelab.trial"])].iloc[0]
        assert child.info.run_id == row.run_id
        if row.state == "pruned":  # a normal end: FINISHED, the reason and the step in tags
            assert child.info.status == "FINISHED" and child.data.tags["scalelab.stop_reason"] == "pruned"
            assert int(child.data.tags["scalelab.pruned_step"]) == row.pruned_step == row.steps < 3 * 39
            assert (workdir / "results/sweeps/tpe/trials" / f"{row.trial:04d}" / "checkpoints").is_dir()
    best = study.best_trial
    assert parent.data.tags["scalelab.best_trial"] == str(best.number)
    assert parent.data.tags["scalelab.best_run_id"] == best.user_attrs["run_id"]
    assert parent.data.metrics["best_val_loss"] == pytest.approx(best.value)
    assert parent.data.metrics["trials_pruned"] == len(pruned)


def test_a_cancelled_worker_loses_its_trial_and_a_preempted_one_resumes_it(workdir, prepared_digits, slurm_cluster):
    # trials of ~5,900 steps (~7 s, more under load): each worker is signalled inside its first trial.
    # The test watches from the moment the array exists (its ids in the manifest), not from the end
    # of `sweep submit`: under CI's load that command once exited after every trial had ended
    train = {**ONE_TASK, "epochs": 150, "checkpoint_every_steps": 50, "log_every_steps": 50}
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train=train,
            tracking={"system_metrics_interval_s": 0},
            sweep={"heartbeat_timeout_s": 120, "evaluate": False},  # collect sees the cancelled element
        ),
    )
    env = {**os.environ, **slurm_cluster}
    submitting = start_submit(
        workdir, prepared_digits, slurm_cluster, "cx", "--method", "random", "--trials", "3", "--parallel", "2",
        "-S", "train.lr=loguniform(0.01,0.1)",
    )  # fmt: skip
    folder = workdir / "results/sweeps/cx"

    def array_ids():  # the manifest is saved again, with the array's ids, as soon as sbatch returns
        manifest = folder / "manifest.json"
        return manifest.is_file() and [e["job_id"] for e in json.loads(manifest.read_text())["elements"]]

    jobs = wait_for(array_ids, 120, "the job array's ids in the manifest", submitting, log=submit_log(workdir, "cx"))

    def first_trial(worker):  # the trial the worker claimed first, once it has a checkpoint
        claim = folder / "workers" / f"{worker:03d}" / "claim-000.json"
        if not claim.exists():
            return None
        number = json.loads(claim.read_text())["number"]
        return number if list((folder / "trials" / f"{number:04d}" / "checkpoints").glob("step-*.pt")) else None

    # each worker is signalled as soon as its own first trial has a checkpoint: thousands of steps
    # remain, so the signal lands inside that trial (scancel kills after KillWait, 5 s)
    signals = {0: ["scancel", "--signal=USR2", jobs[0]], 1: ["scancel", jobs[1]]}
    signalled = {}

    def signal_each_in_its_first_trial() -> bool:
        for worker in set(signals) - set(signalled):
            number = first_trial(worker)
            if number is not None:
                subprocess.run(signals[worker], env=env, check=True)
                signalled[worker] = number
        return len(signalled) == 2

    try:
        wait_for(
            signal_each_in_its_first_trial,
            300,
            "a first checkpoint of each worker",
            log=[log_of("workers signalled", lambda: str(sorted(signalled))), slurm_logs(workdir)],
            poll_s=0.1,
        )
        preempted, cancelled = signalled[0], signalled[1]
        submitted(workdir, submitting, "cx")
        summary, client, parent = collect_until_done(workdir, slurm_cluster, "cx")
    finally:
        subprocess.run(["scancel", *jobs], env=env)
        if submitting.poll() is None:
            submitting.kill()
    rows = summary.set_index("trial")
    print(summary.to_string())  # shown with `pytest -rP`
    # the trial the cancelled worker was running (its first, unless the signal came late) is lost,
    # and it claimed no other one after it
    claims = sorted((folder / "workers/001").glob("claim-*.json"))
    last = json.loads(claims[-1].read_text())["number"]
    assert cancelled == json.loads(claims[0].read_text())["number"]
    lost = summary[summary.lost.astype(bool)]
    assert list(lost.trial) == [last] and rows.loc[last, "state"] == "failed", summary.to_string()
    assert "cancelled" in rows.loc[last, "error"] or "ended" in rows.loc[last, "error"]
    ended = summary[~summary.lost.astype(bool)]
    assert len(ended) == 3 and set(ended.state) == {"finished"}, summary.to_string()  # the budget, all spent
    assert len(summary) == 4  # the lost trial was replaced
    assert client.get_run(rows.loc[last, "run_id"]).info.status in ("FAILED", "KILLED")

    # the preempted trial: the same number, the same run, resumed from its checkpoint after the
    # requeue. Usually the worker's first trial; a signal slow to arrive under load may land in its
    # next one, so the resumed run is found by its tag
    study = study_of(folder)
    runs = {t.number: client.get_run(t.user_attrs["run_id"]) for t in study.trials}
    resumed = [n for n, run in runs.items() if "scalelab.resumed_from_step" in run.data.tags]
    assert len(resumed) == 1, {n: r.data.tags.get("scalelab.resumed_from_step") for n, r in runs.items()}
    trial = study.trials[resumed[0]]
    assert trial.user_attrs["worker"] == 0 and trial.state == optuna.trial.TrialState.COMPLETE
    run = runs[trial.number]
    assert rows.loc[trial.number, "run_id"] == run.info.run_id == trial.user_attrs["run_id"]
    assert run.info.status == "FINISHED" and run.data.tags["scalelab.stop_reason"] == "completed"
    assert run.data.tags["launch.slurm_restart_count"] == "1"
    assert 0 < int(run.data.tags["scalelab.resumed_from_step"]) < 150 * 39
    assert preempted in {n for n, r in runs.items() if r.data.tags.get("scalelab.sweep_worker") == "0"}
    history = subprocess.run(
        ["sacct", "-D", "-j", jobs[0], "-X", "-n", "-P", "-o", "JobID,State"], env=env, capture_output=True, text=True
    ).stdout
    assert "REQUEUED" in history or "PREEMPTED" in history, history
