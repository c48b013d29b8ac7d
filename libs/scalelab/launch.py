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
