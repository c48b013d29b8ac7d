"""Starting worker processes on this machine: one process, or torchrun for several.

The launcher knows processes and nodes, not models: it runs `scalelab <worker command> ...` in
fresh processes. `worker_command` and `worker_env` are the one place that builds the torchrun
command line and the workers' environment, for training, study cells and benchmarks alike.
`run_agent` runs that command line with torchrun's elastic agent inside the calling process
(which has imported torch already), not as a `torchrun` child of its own.
`run_ranks` and `serve_rank` are the two sides of the one protocol by which the study's cells
and the benchmarks run measurements in fresh ranks: spec.json in, rank 0's out.json back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.runtime import lifeline
from scalelab.runtime.io import atomic_write_json
from scalelab.tracking import tracking_uri


class LaunchError(RuntimeError):
    """A launched job failed; the message says where its logs are."""

    exit_status = 1  # the CLI's "a failed job"


def worker_command(
    args: list[str], nproc: int | None = None, log_dir: Path | None = None, *, tee: bool = True
) -> list[str]:
    """`python -m scalelab.cli ARGS`, under torchrun with `nproc` local processes when given
    (a standalone rendezvous on a random free port; each rank's stderr in `log_dir`, and, with
    `tee`, on the console too; without it, its stdout in `log_dir` as well)."""
    worker = ["-m", "scalelab.cli", *args]
    if nproc is None:
        return [sys.executable, *worker]
    logs = ["--log-dir", str(log_dir), *(["--redirects", "2", "--tee", "2"] if tee else ["--redirects", "3"])]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*torchrun, "--monitor-interval=0.5", *(logs if log_dir else []), *worker]


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
) -> dict[str, Any]:
    """The launcher's side of the rank protocol: spec.json -> ranks -> out.json.

    Writes `spec` to `<folder>/<name>.spec.json`, runs `scalelab ARGS --spec SPEC --out OUT` to
    the end (`nproc` local ranks under torchrun's agent when given, else one process), and
    returns what global rank 0 wrote to `<folder>/<name>.out.json` (see `serve_rank`).

    Raises:
        LaunchError: the ranks exited non-zero or wrote no result; the message is
            "exit CODE: " and the last three lines of their stderr.
    """
    spec_path, out_path = folder / f"{name}.spec.json", folder / f"{name}.out.json"
    atomic_write_json(spec_path, spec)
    out_path.unlink(missing_ok=True)
    args = [*args, "--spec", str(spec_path), "--out", str(out_path)]
    if nproc is None:
        proc = subprocess.run(worker_command(args), env=worker_env(threads_per_process), capture_output=True, text=True)
        code, tail = proc.returncode, proc.stderr.strip().splitlines()[-3:]
    else:
        with tempfile.TemporaryDirectory(prefix="scalelab-ranks-") as tmp:
            logs = Path(tmp)
            failed = run_agent(worker_command(args, nproc, logs, tee=False), threads_per_process, echo=False)
            code, tail = (0, []) if failed is None else (failed.exitcode, rank_stderr(logs, failed.local_rank)[-3:])
    if code != 0 or not out_path.is_file():
        raise LaunchError(f"exit {code}: {' | '.join(tail)}")
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
    """Runs the workers under torchrun's agent, their output streamed here; returns the signal the
    launcher got (SIGTERM, SIGINT: the agent has stopped the workers), else None.

    Raises:
        LaunchError: naming the first rank that failed, how it ended and its last stderr lines.
    """
    got: list[int] = []
    failed = run_agent(worker_command(args, nproc, log_dir), threads_per_process, echo=True, got=got)
    if got:
        return got[0]
    if failed is not None:
        how = f"was killed by {failed.signal_name()}" if failed.exitcode < 0 else f"exited with {failed.exitcode}"
        lines = [ln for ln in rank_stderr(log_dir, failed.local_rank) if "\r" not in ln and "it/s]" not in ln]
        last = " | ".join(lines)[-600:] or "(none)"
        raise LaunchError(
            f"rank {failed.rank} (pid {failed.pid}) {how}; its last stderr lines: {last}; per-rank logs in {log_dir}"
        )
    return None


class _Gate:
    """sys.stderr while the agent runs: the ranks' output passes until `close()` (the launcher was
    asked to stop: the caller says what happened; the ranks' and the agent's tracebacks are noise)."""

    def __init__(self, target: Any) -> None:
        self.target, self.open, self.line_open = target, True, False

    def write(self, text: str) -> int:
        if self.open and text:
            self.line_open = not text.endswith("\n")
            self.target.write(text)
        return len(text)

    def close(self) -> None:
        """Ends the line a rank left open (a progress bar), so that the caller's starts on its own."""
        if self.open and self.line_open:
            self.target.write("\n")
        self.open = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def run_agent(cmd: list[str], threads_per_process: int, *, echo: bool, got: list[int] | None = None) -> Any:
    """Runs the torchrun command line `cmd` (from `worker_command`) with torchrun's own elastic
    agent in this process: one Python process less per job than a torchrun child, which would
    import torch a second time. Returns the first failed rank's `ProcessFailure` (its `rank` set),
    else None. SIGTERM and SIGINT raise torchrun's SignalException, so the agent stops the
    workers with that signal, as torchrun does; the signal goes to `got`. With `echo`, the ranks'
    tee'd output goes to stderr until then; without, nothing does.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    got = [] if got is None else got
    gate = _Gate(sys.stderr)

    def quiet() -> None:  # the ranks' output, the agent's "shutting down workers" and exit codes
        gate.close()
        logging.disable(logging.ERROR)

    def stop(signum: int, frame: Any) -> None:
        quiet()
        got.append(signum)
        if len(got) == 1:  # a second signal must not cut the agent's shutdown of the workers short
            raise SignalException(f"{signal.Signals(signum).name}", sigval=signal.Signals(signum))

    env = worker_env(threads_per_process)
    saved_env = dict(os.environ)
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    os.environ.update(env)
    if not echo:
        quiet()
    try:
        with contextlib.redirect_stderr(gate):
            # SIGTERM and SIGINT are this function's (stop), the other two torchrun's, as usual
            run(parse_args(["--signals-to-handle=SIGHUP,SIGQUIT", *cmd[cmd.index("torch.distributed.run") + 1 :]]))
    except SignalException:
        return None
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        failure.rank = rank
        return None if got else failure
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(saved_env)
        logging.disable(logging.NOTSET)
    return None


def rank_stderr(log_dir: Path, local_rank: int) -> list[str]:
    """The non-empty lines of the newest attempt's stderr log of `local_rank` under torchrun's `log_dir`."""
    logs = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    return [ln.strip() for ln in (logs[-1].read_text(errors="replace").splitlines() if logs else []) if ln.strip()]
