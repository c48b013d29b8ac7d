"""Starting worker processes on this machine: one process, or torchrun for several.

The launcher knows processes and nodes, not models: it runs `scalelab <worker command> ...` in
fresh processes. `worker_command` and `worker_env` are the one place that builds the torchrun
command line and the workers' environment, for training and for study cells alike.
"""

from __future__ import annotations

import os
import subprocess
import sys

from scalelab.tracking import tracking_uri


class LaunchError(RuntimeError):
    """A launched job failed; the message says where its logs are."""

    exit_status = 1  # the CLI's "a failed job"


def worker_command(args: list[str], nproc: int | None = None) -> list[str]:
    """`python -m scalelab.cli ARGS`, under torchrun with `nproc` local processes when given
    (a standalone rendezvous on a random free port)."""
    worker = ["-m", "scalelab.cli", *args]
    if nproc is None:
        return [sys.executable, *worker]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *worker]


def worker_env(threads_per_process: int) -> dict[str, str]:
    """This environment plus the workers' threads and an absolute tracking URI.

    The URI travels in the environment, never on a command line, so credentials in it stay out
    of `ps`.
    """
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads_per_process)
    env["MLFLOW_TRACKING_URI"] = tracking_uri()
    if env["MLFLOW_TRACKING_URI"].startswith("http"):  # give up on a dead server in ~30 s, not ~4 min
        env.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
        env.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_workers(
    args: list[str], *, nproc: int | None, threads_per_process: int, capture: bool = False
) -> subprocess.CompletedProcess:
    """Runs the workers to the end and returns the finished process (stdout/stderr if `capture`)."""
    return subprocess.run(
        worker_command(args, nproc), env=worker_env(threads_per_process), capture_output=capture, text=True
    )
