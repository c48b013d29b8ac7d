"""Test helpers: tiny params, writing them, running the CLI, and the training-only pipeline.

Import them from here (`from helpers import run_cli`); conftest.py holds only fixtures.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tiny_params(**sections: dict[str, Any]) -> dict[str, Any]:
    """params.yaml shrunk to seconds of work; `sections` update it key by key (nested)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"].update(
        epochs=2,
        batch_size=32,
        checkpoint_every_steps=10,
        log_every_steps=5,
        untimed_steps=2,
        model={"hidden": [32], "dropout": 0.1},
    )
    return merge(params, sections)


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and key != "model":
            merge(base[key], value)
        else:
            base[key] = value
    return base


def copy_repo(dest: Path) -> Path:
    """A git-committed copy of the repo's tracked and untracked-not-ignored files at `dest` (no
    results, no mlflow.db); returns `dest`."""
    import shutil

    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for rel in files:
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "test copy"], cwd=dest, check=True)
    return dest


def write_params(path: Path, params: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Runs `scalelab ARGS` (or another .venv tool when args[0] is one) in `cwd`."""
    tool = args[0] if (BIN / args[0]).exists() and args[0] in ("dvc", "mlflow", "torchrun") else None
    cmd = [str(BIN / tool), *args[1:]] if tool else [str(BIN / "scalelab"), *args]
    full_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
        )
    return proc


def training_pipeline(repo: Path, params: dict[str, Any], commit: bool = False) -> dict[str, Any]:
    """Writes `params` without the speedup section and a dvc.yaml of validate/prepare/train/evaluate."""
    params = {k: v for k, v in params.items() if k != "speedup"}
    write_params(repo / "params.yaml", params)
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())
    keep = ("validate", "prepare", "train", "evaluate")
    stages["stages"] = {k: v for k, v in stages["stages"].items() if k in keep}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(stages, sort_keys=False))
    if commit:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "tiny"], cwd=repo, check=True
        )
    return params


def train_here(params: Any, data_dir: Path, out: Path, stop: Any = None) -> dict[str, Any]:
    """Trains in this process as a rank does: resolve (data, model, plan) once, then run the job."""
    from scalelab.training import job
    from scalelab.training.plan import read_resolved
    from scalelab.training.submit import resolve

    params, plan = read_resolved(resolve(params, data_dir, out))
    return job.run(params, plan, data_dir, out, stop=stop)


def wait_for(
    predicate: Any,
    timeout_s: float,
    what: str,
    proc: subprocess.Popen | None = None,
    poll_s: float = 0.05,
    log: str | Path | None = None,
) -> Any:
    """Polls `predicate` every `poll_s` and returns its first truthy value; fails naming `what` after
    `timeout_s`, or at once when `proc` (if given) has ended first. A failure ends with the last
    3000 characters of `log` (the process's stderr file, say), so CI's report says why."""
    import time

    def tail() -> str:
        return f"\n{log}:\n{Path(log).read_text()[-3000:]}" if log is not None and Path(log).is_file() else ""

    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args[:3]} exited {proc.returncode} before {what}{tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{tail()}")
        time.sleep(poll_s)
    return got


def slurm_queued(job_ids: list[str], env: dict[str, str]) -> bool:
    """Whether any of the SLURM jobs (or array elements) is still pending, running or completing:
    one `squeue`, far cheaper than a `scalelab sweep collect` (an MLflow client) at each poll."""
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i"], env={**os.environ, **env}, capture_output=True, text=True
    )
    return bool(out.stdout.strip()) or out.returncode != 0  # an error (a busy slurmctld): ask again


def free_port() -> int:
    """A TCP port that nothing listens on at 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_tree(pid: int) -> list:
    """The process and all its descendants (psutil), the ranks included: torchrun starts each in a
    session of its own, out of reach of a signal to the launcher's process group."""
    import psutil

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def signal_all(procs: list, signum: int) -> None:
    """Sends `signum` to each of `procs` (psutil processes) that still exists."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signum)


def group_alive(pgid: int) -> bool:
    """True while any process of process group `pgid` lives."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# Where the fault tests' figures and the UI screenshot go: `make test` points these at
# results/bench/reliability.json and results/test-artifacts/; a bare pytest run gets them in its
# temporary folder (conftest.py sets both and prints where). Never the checkout otherwise.
RELIABILITY_ENV = "SCALELAB_RELIABILITY_JSON"
ARTIFACTS_ENV = "SCALELAB_TEST_ARTIFACTS"


def shown_artifacts_dir() -> Path:
    """The folder for files people look at after a run (the MLflow UI screenshot)."""
    import tempfile

    return Path(os.environ.get(ARTIFACTS_ENV) or Path(tempfile.gettempdir()) / "scalelab-test-artifacts")


def reliability_path() -> Path:
    """The reliability.json this session writes (never the checkout unless `make test` asks)."""
    import tempfile

    return Path(os.environ.get(RELIABILITY_ENV) or Path(tempfile.gettempdir()) / "scalelab-reliability.json")


def record_reliability(section: str, figures: dict[str, Any]) -> None:
    """Merges one fault test's figures into reliability_path(), under a lock (in the temp folder,
    not beside the file): parallel test workers read-modify-write the one file in turn."""
    import hashlib
    import json
    import tempfile

    from filelock import FileLock

    path = reliability_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    with FileLock(Path(tempfile.gettempdir()) / f"scalelab-reliability-{key}.lock"):
        data = json.loads(path.read_text()) if path.is_file() else {}
        data.setdefault(section, {}).update(figures)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


# wall-clock figures: the only ones a restart may change
TIMING_METRICS = {"step_time_ms", "samples_per_s", "mean_step_time_ms", "mean_samples_per_s"}


def histories(run_id: str, uri: str | None = None) -> dict[str, list[tuple[int, float]]]:
    """Every non-timing metric of a run (not step_time_ms, samples_per_s, system/*) as
    [(step, value)] in step order, read from `uri` (default: this process's tracking URI)."""
    from mlflow import MlflowClient

    if uri is None:
        from scalelab.tracking.tracker import tracking_uri

        uri = tracking_uri()
    client = MlflowClient(uri)
    keys = client.get_run(run_id).data.metrics
    keys = sorted(k for k in keys if k not in TIMING_METRICS and not k.startswith("system/"))
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def paired_bootstrap_ci(arm: list[float], reference: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """The benchmarks' stated interval, recomputed here from the raw repeats without their code: the
    median over repeats of arm[i] / reference[i], whole repeats (pairs) resampled `resamples` times
    with numpy's default generator from `seed`, the 2.5th and 97.5th percentiles (linear)."""
    import statistics

    import numpy as np

    if len(arm) != len(reference) or not arm:
        raise ValueError(f"unpaired repeats: {len(arm)} and {len(reference)}")
    ratios = [a / r for a, r in zip(arm, reference)]
    picks = np.random.default_rng(seed).integers(0, len(ratios), (resamples, len(ratios)))
    medians = [statistics.median(ratios[i] for i in row) for row in picks.tolist()]
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def summary_verdict(line: str) -> tuple[str, str, str, str]:
    """(name, figure text, goal text, verdict) of a summary.md line `- name: figure; goal GOAL: VERDICT`,
    the verdict exactly one of met, not met, not measured (an AssertionError otherwise)."""
    import re

    got = re.fullmatch(r"- ([^:]+): (.*); goal (.*): (met|not met|not measured)", line)
    assert got, f"not a summary line with a verdict: {line!r}"
    return got[1], got[2], got[3], got[4]
