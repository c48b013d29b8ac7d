"""`scalelab train` end to end: validate and plan once, then run here, under torchrun, or on SLURM.

    scalelab train --params params.yaml --data data/prepared --out results/train

`launch()` checks everything before any process, job or MLflow run exists: the prepared data, the
model, the run plan (`RunPlan.of`), the job's shape (on this machine, or the SLURM pre-flight) and,
when checkpoints go to a store (`train.checkpoint_dir`), that the store answers.
It writes `<out>/resolved.json` once; every rank reads it (`scalelab train-worker`), locally and on
SLURM alike. By hand, on 2 CPU processes, after a `scalelab train` has written it:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli train-worker \
        --resolved results/train/resolved.json --data data/prepared --out results/train
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, Params, strategies
from scalelab.data.store import DataError, open_split, verify
from scalelab.launch import slurm
from scalelab.launch.local import LaunchError, run_torchrun, worker_env
from scalelab.launch.shape import check_shape, local_capacity, train_shape
from scalelab.runtime import dist, lifeline
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.lock import FolderLock
from scalelab.runtime.paths import repo_root
from scalelab.runtime.signals import StopFlag, raise_on_sigterm, wait_for_requeue
from scalelab.storage import StoreError, configured, is_url
from scalelab.tracking import tracking_uri
from scalelab.tracking.secrets import mask_uri
from scalelab.training import evaluation, job, workloads
from scalelab.training.checkpoint import Checkpointer, fingerprint
from scalelab.training.checkpoint_files import check_location, checkpoint_location
from scalelab.training.plan import RESOLVED_FILE, RunPlan, read_resolved, write_resolved
from scalelab.training.resume_from import check_resume_from

log = logging.getLogger(__name__)


def plan_job(params: Params, data_dir: str | Path, out_dir: str | Path | None = None) -> RunPlan:
    """Checks the data, the model, `train.resume_from` and the plan, before anything is written or
    started (`out_dir`: the job's output folder, when known).

    Raises:
        ConfigError, DataError: naming what is wrong.
    """
    manifest = verify(data_dir)
    t = params.train
    wl = workloads.load(
        t.workload,
        t.model,
        input_shape=manifest["input_shape"],  # a model that cannot be built
        num_classes=manifest["num_classes"],
    )
    if wl.data != manifest["kind"]:
        raise DataError(
            f"{data_dir} holds {manifest['kind']} (data.source {manifest['source']!r}), but train.workload = "
            f"{t.workload!r} consumes {wl.data}; prepare it again from these params: dvc repro prepare"
        )
    splits = {name: len(open_split(data_dir, name, manifest, seq_len=wl.seq_len)) for name in ("train", "val", "test")}
    empty = [name for name in ("val", "test") if splits[name] == 0]
    if empty:
        raise DataError(
            f"{data_dir}: the {empty[0]} split holds no sample of train.model.seq_len = {wl.seq_len} tokens"
        )
    check_resume_from(t.resume_from, out_dir)
    plan = RunPlan.of(t, splits["train"])
    if out_dir is None or not t.checkpoint_dir:
        return plan
    return dataclasses.replace(plan, checkpoints=locate_checkpoints(params, manifest, out_dir))


def locate_checkpoints(params: Params, manifest: dict[str, Any], out_dir: str | Path) -> str:
    """Where the job's checkpoints go (`train.checkpoint_dir`): a folder, or a URL in a store that
    has answered with these credentials.

    Raises:
        StoreError: `store` without a store, or a store that is unreachable or refuses the credentials.
    """
    t = params.train
    store = configured(repo_root()) if t.checkpoint_dir == "store" or is_url(t.checkpoint_dir) else None
    location = checkpoint_location(t.checkpoint_dir, out_dir, fingerprint(t, manifest), store)
    check_location(location)
    return location


def checkpoints_of(out_dir: str | Path) -> Checkpointer:
    """The job's checkpoint folder, where its plan put it (`<out>/checkpoints` unless
    `train.checkpoint_dir` says otherwise), to read its job.json and steps."""
    resolved = Path(out_dir) / RESOLVED_FILE
    location = json.loads(resolved.read_text())["plan"].get("checkpoints", "") if resolved.is_file() else ""
    return Checkpointer(location or Path(out_dir) / "checkpoints", "")


def resolve(params: Params, data_dir: str | Path, out_dir: str | Path) -> Path:
    """`plan_job`, then writes `<out_dir>/resolved.json`; returns its path."""
    return write_resolved(out_dir, params, plan_job(params, data_dir, out_dir))


def launch(params: Params, data_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Validates, plans, and trains: in this process (single, dp), under torchrun (ddp, fsdp) or on SLURM."""
    t = params.train
    uri = tracking_uri()  # a malformed .scalelab.local.yaml: one line, exit 2, before anything starts
    if t.launcher == "local":
        misfit = check_shape(train_shape(t), local_capacity())
        if misfit:
            raise ConfigError(misfit.message("train"))
    else:
        profile = slurm.load_profile(params.slurm.profile)
        slurm.preflight(params, profile, uri)
    plan = plan_job(params, data_dir, out_dir)
    with FolderLock(out_dir):  # one job per output folder, from here until every process has ended
        resolved = write_resolved(out_dir, params, plan)
        if t.launcher == "slurm":
            return run_slurm(params, profile, resolved, data_dir, out_dir)
        if not strategies.get(t.strategy).distributed:
            try:
                return run_worker(resolved, data_dir, out_dir)
            except KeyboardInterrupt:  # the job has closed its run KILLED
                raise Interrupted(signal.SIGINT, out_dir, close_run(params, out_dir, "KILLED")) from None
        return run_local_ddp(params, resolved, data_dir, out_dir)


def run_local_ddp(params: Params, resolved: Path, data_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """torchrun on this machine; a run a dead rank left RUNNING is closed here."""
    t = params.train
    args = ["train-worker", "--resolved", str(resolved), "--data", str(data_dir), "--out", str(out_dir)]
    try:
        got = run_torchrun(
            args, nproc=t.nproc_per_node, threads_per_process=t.threads_per_process, log_dir=Path(out_dir) / "logs"
        )
    except LaunchError:
        close_run(params, out_dir, "FAILED")  # a rank died (even rank 0): the run must not stay RUNNING
        raise
    if got is not None:  # the launcher was asked to stop (Ctrl-C, a scheduler's SIGTERM)
        raise Interrupted(got, out_dir, close_run(params, out_dir, "KILLED"))
    return {}


class Interrupted(Exception):
    """The job was stopped by a signal; one line says which run, its status and where it resumes."""

    kind = "interrupted"  # the CLI's word for it, instead of "error"

    def __init__(self, signum: int, out_dir: str | Path, status: str | None) -> None:
        self.exit_status = 128 + signum  # 130 for Ctrl-C, as a shell reports it
        try:
            ckpt = checkpoints_of(out_dir)
            run_id, steps = (ckpt.meta() or {}).get("run_id"), ckpt.steps()  # full and sharded, newest first
        except StoreError:  # the store stopped answering too
            run_id, steps = None, []
        where = f"resumes from step {steps[0]}" if steps else "starts again from step 0 (no checkpoint yet)"
        run = f"run {run_id} is {status or 'of unknown status (the tracking store did not answer)'}"
        run = run if run_id else "no MLflow run was open"
        super().__init__(f"{signal.Signals(signum).name}: {run}; rerun the same command (or `dvc repro`): it {where}")


def close_run(params: Params, out_dir: str | Path, status: str) -> str | None:
    """Ends the job's MLflow run with `status` if it is still RUNNING (a rank died before it could);
    returns the run's final status (None without a run, or when the store does not answer). The id
    is the one rank 0 recorded in the checkpoint folder's job.json."""
    try:
        run_id = (checkpoints_of(out_dir).meta() or {}).get("run_id")
    except StoreError as exc:  # the store stopped answering: the job's own error says so
        log.error("%s", exc)
        return None
    if not params.tracking.enabled or not run_id:
        return None
    from scalelab.tracking import runs

    try:
        return runs.end_if_open(run_id, status)
    except Exception as exc:  # the store is down: say so, and let the job's own error through
        log.error("could not set run %s to %s in %s: %s", run_id, status, mask_uri(tracking_uri()), mask_uri(str(exc)))
    return None


def run_worker(resolved: str | Path, data_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """One rank of a local job (or the whole job for single and dp): SIGTERM ends the run KILLED."""
    raise_on_sigterm()
    lifeline.exit_with_torchrun()
    params, plan = read_resolved(resolved)
    summary = job.run(params, plan, data_dir, out_dir)
    dist.shutdown()  # after a job that ended normally only: a rank being stopped (SIGTERM, a dead peer)
    return summary  # must not wait in destroy_process_group for peers that are gone


def run_slurm(
    params: Params, profile: slurm.Profile, resolved: Path, data_dir: str | Path, out_dir: str | Path
) -> dict[str, Any]:
    """Submits one training job through submitit (after the pre-flight), streams it, and waits."""
    os.environ.update(worker_env(params.train.threads_per_process))  # sbatch exports it to the tasks
    ex = slurm.train_executor(params, profile, name=f"scalelab-{params.train.workload}")
    submitted = slurm.submit(
        ex, TrainJob(str(resolved.resolve()), str(Path(data_dir).resolve()), str(Path(out_dir).resolve()))
    )
    atomic_write_json(Path(out_dir) / "slurm.json", {"job_id": submitted.job_id, "folder": str(submitted.paths.folder)})
    print(
        f"submitted SLURM job {submitted.job_id} ({params.train.num_nodes} nodes x "
        f"{params.train.nproc_per_node} tasks); logs in {submitted.paths.folder}",
        flush=True,
    )
    try:
        return slurm.wait(submitted, params.slurm.poll_interval_s)
    except Exception:
        state = submitted.state
        cancelled = state.startswith("CANCELLED")
        close_run(params, out_dir, "KILLED" if cancelled or state == "TIMEOUT" else "FAILED")
        why = "was cancelled (scancel or the scheduler)" if cancelled else f"failed ({state})"
        if state == "TIMEOUT":  # past its limit with no requeue left (or none that could be made)
            why = (
                f"hit its {profile.time_limit_min} min time limit and was not requeued "
                f"(slurm.max_timeouts = {params.slurm.max_timeouts})"
            )
        detail = "" if cancelled else f": {slurm.error_line(submitted)}"
        raise LaunchError(f"SLURM job {submitted.job_id} {why}{detail}; logs: {submitted.paths.stderr}") from None


class TrainJob:
    """The callable each SLURM task runs: one rank of the training job; checkpointable."""

    def __init__(self, resolved: str, data_dir: str, out_dir: str, evaluate: bool = False) -> None:
        self.resolved, self.data_dir, self.out_dir, self.evaluate = resolved, data_dir, out_dir, evaluate

    def __call__(self) -> dict[str, Any]:
        import submitit

        # cuda devices: one task per GPU, picked by LOCAL_RANK in runtime.device.setup_process
        slurm.export_rank_env()
        # submitit's folder with %j resolved, for the provenance tag launch.submitit_folder
        os.environ["SUBMITIT_FOLDER"] = str(submitit.JobEnvironment().paths.folder)
        requeue = signal.getsignal(signal.SIGUSR2)  # submitit's: checkpoint() + scontrol requeue
        stop = StopFlag().arm(signal.SIGUSR2)  # ours: only sets a flag; the loop acts on it
        params, plan = read_resolved(self.resolved)
        summary = job.run(params, plan, self.data_dir, self.out_dir, stop=stop)
        dist.shutdown()  # NCCL's communicators end here, not at interpreter exit (a failed job just exits)
        rank = int(os.environ["RANK"])
        if summary["preempted"]:
            if rank == 0 and callable(requeue):
                requeue(signal.SIGUSR2, None)  # the checkpoint is on disk: requeue (and exit)
            wait_for_requeue()  # every rank: the requeue's SIGTERM ends the task; no stale result
        if self.evaluate and rank == 0:
            summary["eval"] = evaluation.run(params, self.data_dir, self.out_dir, Path(self.out_dir) / "eval.json")
        return summary

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on rank 0 before requeueing: the state is already on disk."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
