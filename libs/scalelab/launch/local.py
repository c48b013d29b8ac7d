"""Starting worker processes on this machine: one process, or torchrun for several.

The launcher knows processes and nodes, not models: it runs `scalelab <worker command> ...` in
fresh processes. `worker_command` and `worker_env` are the one place that builds the torchrun
command line and the workers' environment, for training, study cells and benchmarks alike.
`run_ranks` and `serve_rank` are the two sides of the one protocol by which the study's cells
and the benchmarks run measurements in fresh ranks: spec.json in, rank 0's out.json back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.runtime import lifeline
from scalelab.runtime.io import atomic_write_json
from scalelab.tracking import tracking_uri


class LaunchError(RuntimeError):
    """A launched job failed; the message says where its logs are."""

    exit_status = 1  # the CLI's "a failed job"


def worker_command(args: list[str], nproc: int | None = None, log_dir: Path | None = None) -> list[str]:
    """`python -m scalelab.cli ARGS`, under torchrun with `nproc` local processes when given
    (a standalone rendezvous on a random free port; each rank's stderr also in `log_dir`)."""
    worker = ["-m", "scalelab.cli", *args]
    if nproc is None:
        return [sys.executable, *worker]
    logs = ["--log-dir", str(log_dir), "--redirects", "2", "--tee", "2"] if log_dir else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *logs, *worker]


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


def run_ranks(
    args: list[str],
    spec: dict[str, Any],
    folder: Path,
    name: str,
    *,
    nproc: int | None,
    threads_per_process: int,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """The launcher's side of the rank protocol: spec.json -> ranks -> out.json.

    Writes `spec` to `<folder>/<name>.spec.json`, runs `scalelab ARGS --spec SPEC --out OUT` to
    the end (under torchrun with `nproc` local ranks when given, else as one process), and
    returns what global rank 0 wrote to `<folder>/<name>.out.json` (see `serve_rank`).

    Raises:
        LaunchError: the ranks exited non-zero or wrote no result; the message is
            "exit CODE: " and the last three lines of their stderr.
        subprocess.TimeoutExpired: they ran longer than `timeout_s`.
    """
    spec_path, out_path = folder / f"{name}.spec.json", folder / f"{name}.out.json"
    atomic_write_json(spec_path, spec)
    out_path.unlink(missing_ok=True)
    cmd = worker_command([*args, "--spec", str(spec_path), "--out", str(out_path)], nproc)
    env = worker_env(threads_per_process)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not out_path.is_file():
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise LaunchError(f"exit {proc.returncode}: {tail}")
    return json.loads(out_path.read_text())


def serve_rank(
    measure: Callable[[dict[str, Any]], dict[str, Any]], spec_path: str | Path, out_path: str | Path
) -> None:
    """One rank's side of the protocol: reads the spec, runs `measure(spec)`, and the rank whose
    result says `is_main` (global rank 0) writes the rest of it to `out_path` atomically.

    Under torchrun the rank also stops itself once torchrun is gone (runtime.lifeline).
    """
    lifeline.exit_with_torchrun()
    result = measure(json.loads(Path(spec_path).read_text()))
    if result.pop("is_main"):
        atomic_write_json(out_path, result)


def run_torchrun(args: list[str], *, nproc: int, threads_per_process: int, log_dir: Path) -> int | None:
    """Runs the workers under torchrun, streaming their output; returns the signal the launcher got
    while it waited (SIGTERM, SIGINT: it waits for torchrun to stop the workers), else None.

    Raises:
        LaunchError: naming the first rank that failed, how it ended and its last stderr lines.
    """
    got: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        cmd = worker_command(args, nproc, log_dir)
        proc = subprocess.Popen(cmd, env=worker_env(threads_per_process), stderr=subprocess.PIPE, text=True)
        tail: deque[str] = deque(maxlen=300)
        for line in proc.stderr:
            if not got:  # once asked to stop, torchrun's own traceback is noise: the caller says what happened
                sys.stderr.write(line)
            tail.append(line)
        code = proc.wait()
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    if got:
        return got[0]
    if code != 0:
        raise LaunchError(describe_failure(list(tail), log_dir, code))
    return None


ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(\d+) \(local_rank: (\d+)\).*?exitcode\s*:\s*(-?\d+)"
    r" \(pid: (\d+)\)",
    re.S,
)


def describe_failure(torchrun_stderr: list[str], log_dir: Path, code: int) -> str:
    """The dead rank, how it ended and its last stderr lines, from torchrun's failure summary."""
    found = ROOT_CAUSE.search("".join(torchrun_stderr))
    if not found:
        return f"torchrun exited with {code}: see the rank output above; per-rank logs in {log_dir}"
    rank, local_rank, exitcode, pid = found.groups()
    how = f"was killed by {signal.Signals(-int(exitcode)).name}" if int(exitcode) < 0 else f"exited with {exitcode}"
    logs = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    lines = [ln.strip() for ln in (logs[-1].read_text(errors="replace").splitlines() if logs else []) if ln.strip()]
    last = " | ".join(ln for ln in lines if "\r" not in ln and "it/s]" not in ln)[-600:] or "(none)"
    return f"rank {rank} (pid {pid}) {how}; its last stderr lines: {last}; per-rank logs in {log_dir}"
