"""Starting training processes: in this process, under torchrun (local ddp), or on SLURM.

The launcher knows processes and nodes, not models. Everything here runs after params have been
validated (scalelab.params.check_runtime) and before any MLflow run exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scalelab import tracking
from scalelab.params import Params


class LaunchError(RuntimeError):
    """A launched job failed; the message says where its logs are."""


def worker_env(params: Params) -> dict[str, str]:
    """Environment for worker processes: threads per process and an absolute tracking URI."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(params.train.threads_per_process)
    env["MLFLOW_TRACKING_URI"] = tracking.tracking_uri()
    if env["MLFLOW_TRACKING_URI"].startswith("http"):  # give up on a dead server in ~30 s, not ~4 min
        env.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
        env.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def torchrun_command(params: Params, params_file: str | Path, data_dir: str | Path,
                     out_dir: str | Path) -> list[str]:
    """The torchrun command line for a local multi-process run (random free port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={params.train.nproc_per_node}", "-m", "scalelab.cli", "train-worker",
            "--params", str(params_file), "--data", str(data_dir), "--out", str(out_dir)]


def run_local(params: Params, params_file: str | Path, data_dir: str | Path, out_dir: str | Path) -> None:
    """Runs a ddp job under torchrun and waits; raises LaunchError if any rank failed."""
    cmd = torchrun_command(params, params_file, data_dir, out_dir)
    proc = subprocess.run(cmd, env=worker_env(params))
    if proc.returncode != 0:
        raise LaunchError(f"torchrun exited with {proc.returncode}: see the rank tracebacks above; "
                          f"command: {' '.join(cmd)}")


def run_slurm(params: Params, data_dir: str | Path, out_dir: str | Path) -> dict:
    """Pre-flight, submit one training job through submitit, stream it, and wait for it."""
    from scalelab import slurm
    from scalelab.io import atomic_write_json

    profile = slurm.load_profile(params.slurm.profile)
    slurm.preflight(params, profile, tracking.tracking_uri())
    os.environ.update(worker_env(params))  # sbatch exports the submitter's environment to the tasks
    ex = slurm.train_executor(params, profile, name=f"scalelab-{params.train.workload}")
    try:
        job = ex.submit(slurm.TrainJob(params, str(Path(data_dir).resolve()), str(Path(out_dir).resolve())))
    except Exception as exc:  # sbatch refused: no cluster, bad partition, ...
        raise LaunchError(f"sbatch refused the job: {str(exc).strip().splitlines()[-1]}") from None
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out_dir) / "slurm.json", {"job_id": job.job_id, "folder": str(job.paths.folder)})
    print(f"submitted SLURM job {job.job_id} ({params.train.num_nodes} nodes x "
          f"{params.train.nproc_per_node} tasks); logs in {job.paths.folder}", flush=True)
    try:
        return slurm.wait(job, params.slurm.poll_interval_s)
    except Exception:
        raise LaunchError(f"SLURM job {job.job_id} failed: {slurm.error_line(job)}; "
                          f"logs: {job.paths.stderr}") from None
