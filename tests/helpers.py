"""Test helpers: tiny params, writing them, running the CLI, and the training-only pipeline.

Import them from here (`from helpers import run_cli`); conftest.py holds only fixtures.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@functools.cache
def _shipped_params() -> dict[str, Any]:
    """The checkout's params.yaml, parsed once per process (tests never write the checkout; the
    fuzz tests alone ask for it 570 times, at ~60 ms each with PyYAML's pure-Python parser)."""
    return yaml.load((REPO / "params.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def tiny_params(**sections: dict[str, Any]) -> dict[str, Any]:
    """params.yaml shrunk to seconds of work; `sections` update it key by key (nested)."""
    params = copy.deepcopy(_shipped_params())
    params["train"].update(
        epochs=2,
        batch_size=32,
        checkpoint_every_steps=10,
        log_every_steps=5,
        untimed_steps=2,
        model={"hidden": [32], "dropout": 0.1},
    )
    # tests run beside other tests (xdist workers on a shared machine): a study that is not about
    # disturbance keeps every repeat; tests/study/test_busy*.py set the share they test
    params["speedup"]["max_others_cpu_share"] = 1.0
    return merge(params, sections)


# the speedup study shrunk to seconds: a tiny MLP, one batch size, two timed steps, two repeats
TINY_STUDY = {
    "model": {"hidden": [64], "dropout": 0.0},
    "num_features": 32,
    "batch_sizes": [64],
    "warmup_steps": 1,
    "timed_steps": 2,
    "repeats": 2,
    "world_sizes": [1, 2],
}


def ok_or_busy(frame: Any) -> bool:
    """Whether every cell of a study frame measured (`ok`) or was withheld for the study's stated busy
    reason (faster than its cores allow: other tests slowed its single-process twin). Tests that are
    not about disturbance accept either; tests/study/test_busy*.py test the rule itself."""
    busy = (frame.status == "invalid") & frame.reason.astype(str).str.startswith("machine busy")
    return bool(((frame.status == "ok") | busy).all())


def kept_its_cells(frame: Any) -> bool:
    """Whether a study's cells are in its cell cache: a study that withholds a cell as measured on a
    busy machine keeps none of them there (study.run), so a later study measures them again."""
    return not (frame.status == "invalid").any()


def withheld_or(headline: dict[str, Any], key: str) -> bool:
    """Whether the study's headline metrics hold `key`, or say in words why no number is stated (a
    busy machine: other tests share it). Tests that are not about disturbance accept either."""
    return key in headline or headline["headline"].startswith("not measured")


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


# torch 2.13's CPU profiler has aborted a profiled rank in two whole-suite CI runs (glibc found its
# heap corrupted, once right after the profiler started, once right after it stopped). Never seen
# here: 16 profiled `scalelab train` jobs beside a busy loop, and ~8,000 profiler start/stop cycles
# on 2 DDP gloo ranks, all clean. A test of a profiled job reruns it once on that abort alone (a
# user reruns the same way: the job resumes from its last checkpoint).
HEAP_CRASHES = ("malloc(): ", "free(): ", "double free or corruption", "corrupted double-linked list")


def once_more_if_heap_crash(attempt: Callable[[], Any], tidy: Callable[[], None] = lambda: None) -> Any:
    """`attempt()`; if it fails on glibc's heap-corruption abort (above), `tidy()` and once more."""
    try:
        return attempt()
    except AssertionError as err:
        if not any(text in str(err) for text in HEAP_CRASHES):
            raise
        warnings.warn(
            f"a profiled rank aborted with heap corruption (torch's profiler); rerun once:\n{err}", stacklevel=2
        )
        tidy()
        return attempt()


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


# Where a failing test finds out why: the output of the process it waited on. A source is a file
# (the process's stdout/stderr log, a server's log), a callable returning text (a reader thread's
# lines so far, `dvc queue logs`, the newest SLURM logs: see `newest_logs`), or a list of sources.
LogSource = str | Path | Callable[[], str] | Sequence["LogSource"]
TAIL_CHARS = 4000  # of each source: the end of a traceback and the lines before it


def output_tail(log: LogSource, num_chars: int = TAIL_CHARS) -> str:
    """The last `num_chars` of each source in `log`, each under its name, for a failure message.
    Never raises: a source that cannot be read says why in its place."""
    if isinstance(log, (list, tuple)):
        return "".join(output_tail(source, num_chars) for source in log)
    name = getattr(log, "__qualname__", None) if callable(log) else str(log)
    try:
        text = log() if callable(log) else Path(log).read_text(errors="replace") if Path(log).is_file() else None
    except Exception as exc:  # a failure message must not fail in its turn
        text = f"(could not be read: {type(exc).__name__}: {exc})"
    if text is None:
        return f"\n--- {name}: no such file ---"
    text = str(text)
    cut = f"(... {len(text) - num_chars} characters before)\n" if len(text) > num_chars else ""
    return f"\n--- {name} (last {min(len(text), num_chars)} characters) ---\n{cut}{text[-num_chars:]}"


@contextlib.contextmanager
def says_why(log: LogSource) -> Iterator[None]:
    """Any exception raised inside (a failed assert, a Playwright timeout) carries the output tail
    of `log` as a note, shown under the error in pytest's report."""
    try:
        yield
    except Exception as exc:
        exc.add_note(output_tail(log))
        raise


def log_of(label: str, read: Callable[[], str]) -> Callable[[], str]:
    """A log source that `read` returns (e.g. a reader thread's lines so far), named `label` in a
    failure message."""

    def source() -> str:
        return read()

    source.__qualname__ = label
    return source


def newest_logs(folder: Path, *patterns: str, count: int = 4) -> Callable[[], str]:
    """A log source: the newest `count` files under `folder` (recursively) that match any of
    `patterns` (e.g. submitit's "*_log.err", "*_log.out"), each with its name, oldest first."""

    def read() -> str:
        found = {p for pattern in patterns for p in folder.rglob(pattern) if p.is_file()}
        newest = sorted(found, key=lambda p: p.stat().st_mtime)[-count:]
        if not newest:
            return f"(no {' or '.join(patterns)} under {folder})"
        return "".join(output_tail(p, TAIL_CHARS // len(newest)) for p in newest)

    read.__qualname__ = f"the newest {' / '.join(patterns)} under {folder}"
    return read


def slurm_logs(workdir: Path, count: int = 4) -> Callable[[], str]:
    """A log source: the newest SLURM job logs submitit wrote under `workdir`'s results/slurm/
    (params.yaml's slurm.folder: `<job id>/<job id>_<task>_log.err` and `.out`)."""
    return newest_logs(workdir / "results/slurm", "*_log.err", "*_log.out", count=count)


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen | None = None,
    *,
    log: LogSource,
    poll_s: float = 0.05,
) -> Any:
    """Polls `predicate` every `poll_s` and returns its first truthy value; fails naming `what` after
    `timeout_s`, or at once when `proc` (if given) has ended first.

    `log` is required: the output of whatever the test waits on (the job's stderr file, the
    server's log, a callable returning the lines read so far; several in a list). A failure ends
    with the last TAIL_CHARS of each, so CI's report says why, not only that it failed.
    """
    import time

    if log is None or (isinstance(log, (list, tuple)) and not log):
        raise TypeError("wait_for needs a log: the output of the process the test waits on")
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args[:3]} exited {proc.returncode} before {what}{output_tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{output_tail(log)}")
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


def queue_logs(repo: Path, *names: str) -> Callable[[], str]:
    """A log source for a failure message: `dvc queue status`, then each named experiment's output
    (`dvc queue logs NAME`)."""

    def read() -> str:
        parts = [run_cli("dvc", "queue", "status", cwd=repo, check=False).stdout]
        for name in names:
            logs = run_cli("dvc", "queue", "logs", name, cwd=repo, check=False)
            parts.append(f"$ dvc queue logs {name}\n{logs.stdout}{logs.stderr}")
        return "\n".join(parts)

    return log_of(f"the DVC queue ({', '.join(names)})", read)
