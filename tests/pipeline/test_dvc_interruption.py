"""`dvc repro` interrupted: a second one while the first trains, and a SIGKILL of the whole pipeline.

DVC releases its repository lock (.dvc/tmp/lock) while a stage's command runs and holds read/write
locks on the stage's deps and outs instead (.dvc/tmp/rwlock, with its pid). So a second `dvc repro`
during `train` is refused with the rwlock message ("... is busy, it is being blocked by: (PID n)"),
not "Unable to acquire lock" (that one is for the repository lock, held between commands). A
SIGKILL leaves its pid in .dvc/tmp/rwlock; the next `dvc repro` sees the pid is gone and drops it.

torchrun starts each rank in a session of its own: a signal to dvc's process group does not reach
the ranks. They notice that torchrun is gone and stop (scalelab.runtime.lifeline), so nothing of
a killed pipeline trains on into the folder the rerun uses.
"""

import json
import os
import signal
import subprocess
import time

import pytest
import yaml
from mlflow import MlflowClient

from helpers import (
    BIN,
    output_tail,
    process_tree,
    record_reliability,
    run_cli,
    says_why,
    signal_all,
    tiny_params,
    training_pipeline,
    wait_for,
    write_params,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUSY = "is busy, it is being blocked by:"  # dvc/rwlock.py, the stage-level lock
STALE = "had been killed. Auto removed it from the lock file."  # dvc/rwlock.py, on the next run
UP_TO_DATE = "Data and pipelines are up to date."
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}


def start_repro(repo, log):
    """`dvc repro` in its own session: its process group is the whole pipeline (dvc, the stage's
    shell, scalelab train with torchrun's agent, both ranks, a metrics writer once due)."""
    return subprocess.Popen(
        [str(BIN / "dvc"), "repro"], cwd=repo, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_tree(pid):
    """SIGSTOP to the whole tree, until no new process appears; returns the stopped processes."""
    stopped = {}
    while new := [p for p in process_tree(pid) if p.pid not in stopped]:
        signal_all(new, signal.SIGSTOP)
        stopped.update((p.pid, p) for p in new)
    return list(stopped.values())


def checkpoint_steps(repo):
    return sorted(int(p.stem.split("-")[1]) for p in (repo / "results/train/checkpoints").glob("step-*"))


def train_runs(repo):
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scalelab")
    return client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'train'")


def snapshot(repo):
    """Bytes of dvc.lock and of every file under results/ (the folder lock's holder line aside)."""
    files = {"dvc.lock": (repo / "dvc.lock").read_bytes()}
    for path in sorted((repo / "results").rglob("*")):
        if path.is_file() and path.name != ".lock":
            files[str(path.relative_to(repo))] = path.read_bytes()
    return files


def rwlock(repo):
    path = repo / ".dvc/tmp/rwlock"
    return json.loads(path.read_text()) if path.is_file() else {}


def holders(lock):
    """The pids holding any entry of an rwlock file's content."""
    found = set()
    for infos in [*lock.get("read", {}).values(), *lock.get("write", {}).values()]:
        found |= {info["pid"] for info in (infos if isinstance(infos, list) else [infos])}
    return found


def test_a_second_dvc_repro_while_one_runs_fails_with_the_lock_message_and_corrupts_nothing(repo_copy):
    params = training_pipeline(
        repo_copy, tiny_params(train={"epochs": 20}, tracking={"system_metrics_interval_s": 0}), commit=True
    )
    log_path = repo_copy.parent / "first.log"
    with open(log_path, "wb") as log:
        first = start_repro(repo_copy, log)
    procs = []
    try:
        wait_for(lambda: checkpoint_steps(repo_copy), 300, "train's first checkpoint", first, log=log_path)
        assert first.poll() is None, output_tail(log_path)
        # hold the first pipeline inside `train` (stopped, not ended), however slow this machine is
        procs = stop_tree(first.pid)
        assert len(procs) >= 4, procs  # dvc, scalelab train (torchrun's agent in it), 2 ranks (a shell, a writer)
        before = snapshot(repo_copy)
        started = time.time()
        second = run_cli("dvc", "repro", cwd=repo_copy, check=False, timeout=300)
        refuse_s = time.time() - started
        out = second.stdout + second.stderr
        assert second.returncode != 0, out
        assert BUSY in out and f"(PID {first.pid}): {BIN / 'dvc'} repro" in out, out
        assert "Running stage" not in out, out  # it ran nothing
        assert snapshot(repo_copy) == before, "the refused dvc repro changed dvc.lock or results/"
        signal_all(procs, signal.SIGCONT)
        with says_why(log_path):
            assert first.wait(timeout=600) == 0
    finally:
        if first.poll() is None:
            signal_all(procs, signal.SIGCONT)
            signal_all(process_tree(first.pid), signal.SIGKILL)
            first.wait()
    text = log_path.read_text()
    assert "Running stage 'train'" in text and "Running stage 'evaluate'" in text, output_tail(log_path)
    assert rwlock(repo_copy) == {}, f"{rwlock(repo_copy)}{output_tail(log_path)}"  # the first's locks are released

    # the outputs of a normal run: nothing left to do, the metrics written, one finished run
    assert UP_TO_DATE in run_cli("dvc", "status", cwd=repo_copy).stdout
    assert UP_TO_DATE in run_cli("dvc", "repro", cwd=repo_copy).stdout
    total = json.loads((repo_copy / "results/train/metrics.json").read_text())["steps"]
    assert total == params["train"]["epochs"] * 19  # digits: 19 global batches of 64 per epoch
    assert 0.0 < json.loads((repo_copy / "results/eval/metrics.json").read_text())["test_accuracy"] <= 1.0
    (run,) = train_runs(repo_copy)
    assert run.info.status == "FINISHED" and "test_accuracy" in run.data.metrics
    assert json.loads((repo_copy / "results/train/run.json").read_text())["run_id"] == run.info.run_id
    record_reliability("dvc", {"concurrent_repro_refused": True, "concurrent_repro_refuse_s": round(refuse_s, 2)})


def locked_stages(repo):
    """dvc.lock's stages: what DVC recorded for each stage that completed."""
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]


def test_sigkill_during_train_leaves_dvc_lock_unchanged_and_the_rerun_completes(repo_copy):
    params = training_pipeline(repo_copy, tiny_params(tracking={"system_metrics_interval_s": 0}), commit=True)
    run_cli("dvc", "repro", cwd=repo_copy)
    lock = locked_stages(repo_copy)
    job_json = repo_copy / "results/train/checkpoints/job.json"
    old_job = job_json.read_bytes()

    params["train"]["epochs"] = 20  # a train param: train reruns, from scratch (a new fingerprint)
    write_params(repo_copy / "params.yaml", params)
    total = params["train"]["epochs"] * 19
    log_path = repo_copy.parent / "killed.log"
    with open(log_path, "wb") as log:
        proc = start_repro(repo_copy, log)
    procs = []
    try:
        # job.json is rewritten once the old fingerprint's checkpoints are cleared: any checkpoint
        # present after that is this run's
        wait_for(
            lambda: job_json.is_file() and job_json.read_bytes() != old_job and checkpoint_steps(repo_copy),
            300,
            "a checkpoint of the new train params",
            proc,
            log=log_path,
        )
        assert proc.poll() is None, output_tail(log_path)
        procs = process_tree(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)  # what a CI timeout or `kill -9 -- -PGID` does
        killed = time.time()
        proc.wait(timeout=60)
        wait_for(
            lambda: not any(p.is_running() for p in procs), 120, "every process of the pipeline to end", log=log_path
        )
        gone_s = time.time() - killed
    finally:
        signal_all(procs, signal.SIGKILL)
    with says_why(log_path):
        steps = checkpoint_steps(repo_copy)
        assert steps and steps[-1] < total, steps  # killed inside train
        # no rank trained on to the end after dvc died: no outputs DVC did not record, no FINISHED run
        assert not (repo_copy / "results/train/model.pt").exists(), "a rank outlived the killed pipeline"
        killed_run = json.loads(job_json.read_text())["run_id"]
        assert {r.info.run_id: r.info.status for r in train_runs(repo_copy)}[killed_run] in ("KILLED", "FAILED")
    # validate ran to its end on the new params and DVC recorded it; train and what follows are
    # exactly as before
    after = locked_stages(repo_copy)
    assert after.pop("validate")["params"]["params.yaml"]["train"]["epochs"] == 20
    assert after == {k: v for k, v in lock.items() if k != "validate"}, "SIGKILL during train changed dvc.lock"
    stale = proc.pid in holders(rwlock(repo_copy))  # DVC had no chance to release its locks

    rerun = run_cli("dvc", "repro", cwd=repo_copy)  # no manual cleanup
    out = rerun.stdout + rerun.stderr
    assert "Running stage 'train'" in out and "Running stage 'evaluate'" in out, out[-3000:]
    assert not stale or STALE in out, out[-3000:]
    assert f"| {steps[-1]}/{total} [" in out, out[-3000:]  # the progress bar starts at the checkpoint
    # DVC drops a dead pid's entries only on the paths it then locks for writing: the killed run's
    # read locks on train's code deps stay (harmless: a dead pid blocks nobody, and goes when a
    # stage writes there); no write lock and no live holder is left
    left = rwlock(repo_copy)
    assert "write" not in left and holders(left) <= {proc.pid}, left
    assert UP_TO_DATE in run_cli("dvc", "status", cwd=repo_copy).stdout
    assert locked_stages(repo_copy)["train"] != lock["train"]  # the new params' train and evaluate
    assert json.loads((repo_copy / "results/train/metrics.json").read_text())["steps"] == total
    assert json.loads((repo_copy / "results/train/run.json").read_text())["run_id"] == killed_run
    runs = {r.info.run_id: r for r in train_runs(repo_copy)}
    assert len(runs) == 2 and runs[killed_run].info.status == "FINISHED", {k: r.info.status for k, r in runs.items()}
    record_reliability(
        "dvc",
        {
            "sigkill_trials": 1,
            "sigkill_dvc_lock_unchanged": 1,
            "sigkill_ranks_gone_s": round(gone_s, 2),
            "sigkill_stale_rwlock_left": int(stale),
            "sigkill_stale_read_locks_after_rerun": sum(
                proc.pid in holders({"read": {k: v}}) for k, v in left.get("read", {}).items()
            ),
            "sigkill_recovered_without_cleanup": 1,
            "sigkill_resumed_from_step": steps[-1],
        },
    )
