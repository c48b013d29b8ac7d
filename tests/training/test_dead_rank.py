"""A rank that dies or hangs never leaves the job hanging or its MLflow run RUNNING."""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
from mlflow import MlflowClient

from helpers import BIN, output_tail, record_reliability, says_why, tiny_params, wait_for, write_params

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def start(workdir, prepared_digits, **train):
    """`scalelab train` in the background: long enough (300 epochs) that a killed rank kills it.
    Its stdout and stderr go to train.out and train.err in `workdir` (`stderr_of`)."""
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train={"epochs": 300, "checkpoint_every_steps": 20, **train}, tracking={"system_metrics_interval_s": 0}
        ),
    )
    cmd = [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "out"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with open(workdir / "train.out", "wb") as out, open(stderr_of(workdir), "wb") as err:
        return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=err, start_new_session=True)


def stderr_of(workdir):
    return workdir / "train.err"


def worker(workdir, proc, rank, timeout_s=300):
    """The train-worker process of global rank `rank`."""

    def find():
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "train-worker" in child.cmdline() and child.environ().get("RANK") == str(rank):
                    return child
            except psutil.Error:
                continue
        return None

    return wait_for(find, timeout_s, f"rank {rank}'s train-worker process", proc, log=stderr_of(workdir), poll_s=0.2)


def wait_checkpoint(workdir, proc):
    ckpts = workdir / "out/checkpoints"
    wait_for(lambda: list(ckpts.glob("step-*")), 300, "a checkpoint", proc, log=stderr_of(workdir), poll_s=0.2)


def the_run(workdir):
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert len(runs) == 1
    return runs[0]


@pytest.mark.parametrize("rank", [0, 1])
def test_sigkill_of_any_rank_fails_the_run_and_names_the_rank(workdir, prepared_digits, rank):
    proc = start(workdir, prepared_digits)
    victim = worker(workdir, proc, rank)
    wait_checkpoint(workdir, proc)
    victim.send_signal(signal.SIGKILL)
    killed = time.time()
    with says_why(stderr_of(workdir)):
        proc.wait(timeout=120)
        detect_s = time.time() - killed
        err = stderr_of(workdir).read_text()
        assert proc.returncode == 1
        last = err.strip().splitlines()[-1]
        assert (
            last.startswith("scalelab train: error: ")
            and f"rank {rank} (pid {victim.pid}) was killed by SIGKILL" in last
        )
        assert the_run(workdir).info.status == "FAILED"
    record_reliability("dead_rank", {f"rank{rank}_detect_s": round(detect_s, 2), f"rank{rank}_run_closed": True})


def stop_after_first_checkpoint(workdir, proc, victim):
    """SIGSTOPs `victim` within a few steps of the first checkpoint, however slow this machine is:
    it runs in 20 ms slices (SIGCONT, then SIGSTOP) until the checkpoint is on disk, so the job
    cannot get far past it, or end, while the test looks. Returns when the victim stays stopped."""
    checkpoints = workdir / "out/checkpoints"

    def sliced() -> bool:  # one 20 ms time slice for the victim, then: is the checkpoint on disk?
        victim.resume()
        time.sleep(0.02)  # the victim's slice, not a wait for an outcome
        victim.suspend()
        return bool(list(checkpoints.glob("step-*")))

    try:
        victim.suspend()
        wait_for(sliced, 300, "the first checkpoint", proc, log=stderr_of(workdir), poll_s=0)
    except psutil.NoSuchProcess:
        raise AssertionError(f"rank 1 ended before the first checkpoint{output_tail(stderr_of(workdir))}") from None


def test_a_stopped_rank_times_out_and_the_rerun_resumes(workdir, prepared_digits):
    # the timeout also bounds start-up collectives: rank 1 waits at a barrier while rank 0 creates
    # the MLflow run and its provenance, which takes well over 10 s on a busy machine
    timeout_s, epochs = 30, 10
    train = {"epochs": epochs, "checkpoint_every_steps": 20, "collective_timeout_s": timeout_s}
    proc = start(workdir, prepared_digits, **train)
    victim = worker(workdir, proc, 1)
    stop_after_first_checkpoint(workdir, proc, victim)  # its sockets stay open: the others wait, until the timeout
    stopped = time.time()
    with says_why(stderr_of(workdir)):
        try:  # an event with a deadline: the job ends on its own (a hung one never would); how soon
            # after the 30 s timeout (torchrun then waits up to 30 s for the others) depends on the
            # machine's load, so it is recorded below, not bounded
            proc.wait(timeout=timeout_s + 270)
        finally:
            if victim.is_running():
                victim.kill()
        detect_s = time.time() - stopped
        assert proc.returncode == 1
        assert detect_s >= timeout_s, detect_s  # the collective timeout ended it, not something sooner
        run = the_run(workdir)
        assert run.info.status == "FAILED"
        newest = max(int(p.stem.split("-")[1]) for p in (workdir / "out/checkpoints").glob("step-*"))
        total = epochs * 19  # digits: 19 global batches of 64 per epoch
        assert 0 < newest < total, newest

    write_params(  # the same job: the rerun resumes
        workdir / "params.yaml", tiny_params(train=train, tracking={"system_metrics_interval_s": 0})
    )
    rerun = subprocess.run(
        [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "out"],
        cwd=workdir,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"| {newest}/{total} [" in rerun.stderr, rerun.stderr[-3000:]  # from the checkpoint, not from scratch
    assert json.loads((workdir / "out/run.json").read_text())["run_id"] == run.info.run_id
    steps = [
        m.step
        for m in MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}").get_metric_history(run.info.run_id, "train_loss")
    ]
    assert steps == sorted(set(steps)) and steps[-1] == total
    assert the_run(workdir).info.status == "FINISHED"
    record_reliability(
        "hung_rank",
        {
            "collective_timeout_s": timeout_s,
            "detect_s": round(detect_s, 2),
            "resumed_from_step": newest,
            "recovered": True,
        },
    )
