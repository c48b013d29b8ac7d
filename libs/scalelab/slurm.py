"""SLURM through submitit: cluster profiles, the pre-flight check, and the training job.

`submit_train()` sends one job of num_nodes x nproc_per_node tasks (one task per device) and
`wait()` streams its state and log tail until it ends, so `dvc repro` on a login node blocks like
a local run. The job is submitit-checkpointable: on the profile's signal every rank stops at the
next step boundary, a checkpoint is written, and rank 0 requeues the job, which resumes into the
same MLflow run.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from scalelab.config import ConfigError, build, knob, read_yaml
from scalelab.params import FROZEN, Params
from scalelab import tracking

PROFILES = Path("slurm/profiles")
NCCL_SIGNALS = {"USR1"}  # NCCL installs a SIGUSR1 handler of its own


@dataclass(**FROZEN)
class Profile:
    partition: str = knob("")
    account: str = knob("")
    max_nodes: int = knob(1, ge=1)
    cpus_per_node: int = knob(1, ge=1)
    gpus_per_node: int = knob(0, ge=0)
    mem_gb: float = knob(4.0, gt=0.0)
    time_limit_min: int = knob(60, ge=1)
    signal: str = knob("USR2")
    signal_delay_s: int = knob(90, ge=0)
    shared_paths: list[str] = knob(["/"])
    login_node_is_compute_host: bool = knob(False)
    setup: list[str] = knob([])


def load_profile(name: str, root: Path | None = None) -> Profile:
    path = (root or tracking.repo_root()) / PROFILES / f"{name}.yaml"
    if not path.is_file():
        found = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"slurm.profile = {name!r}: {path} does not exist; profiles: {', '.join(found)}")
    try:
        return build(Profile, read_yaml(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def preflight(params: Params, profile: Profile, uri: str) -> None:
    """Fails fast, before anything is submitted, on a job the cluster cannot run well.

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    t, s = params.train, params.slurm
    if t.num_nodes > profile.max_nodes:
        raise ConfigError(f"train.num_nodes = {t.num_nodes} is more than the {profile.max_nodes} nodes of "
                          f"profile {s.profile!r}; use at most {profile.max_nodes}")
    wants_gpu = t.device == "cuda" or (t.device == "auto" and profile.gpus_per_node > 0)
    if wants_gpu and t.nproc_per_node > profile.gpus_per_node:
        raise ConfigError(f"train.nproc_per_node = {t.nproc_per_node} is more than the {profile.gpus_per_node} "
                          f"GPUs per node of profile {s.profile!r} (one task per GPU)")
    if t.nproc_per_node * t.threads_per_process > profile.cpus_per_node:
        raise ConfigError(f"train.nproc_per_node x threads_per_process = {t.nproc_per_node * t.threads_per_process} "
                          f"is more than the {profile.cpus_per_node} CPUs per node of profile {s.profile!r}")
    if profile.signal.upper().removeprefix("SIG") in NCCL_SIGNALS:
        raise ConfigError(f"profile {s.profile!r}: signal = {profile.signal!r} conflicts with NCCL, which "
                          "catches SIGUSR1; use USR2")
    if t.checkpoint_every_steps * s.est_step_time_s > profile.time_limit_min * 60 - profile.signal_delay_s:
        raise ConfigError(f"train.checkpoint_every_steps = {t.checkpoint_every_steps} x slurm.est_step_time_s = "
                          f"{s.est_step_time_s} s is longer than the {profile.time_limit_min} min time limit "
                          f"of profile {s.profile!r}: no checkpoint would land; checkpoint more often")
    check_tracking_reachable(uri, profile, s.profile)


def check_tracking_reachable(uri: str, profile: Profile, name: str) -> None:
    """The compute nodes must reach the store: a shared SQLite path, or a server not on loopback."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = Path(parsed.path if not parsed.path.startswith("//") else parsed.path[1:])
        if not any(path.resolve().is_relative_to(Path(p)) for p in profile.shared_paths):
            raise ConfigError(f"MLFLOW_TRACKING_URI = {uri!r}: {path} is not under the shared paths "
                              f"{profile.shared_paths} of profile {name!r}, so compute nodes cannot reach "
                              "it; put the store on a shared path or run `make mlflow-server`")
    elif parsed.scheme in ("http", "https"):
        if parsed.hostname in ("127.0.0.1", "localhost", "::1") and not profile.login_node_is_compute_host:
            raise ConfigError(f"MLFLOW_TRACKING_URI = {uri!r} points at loopback, which compute nodes of "
                              f"profile {name!r} cannot reach; use the login node's host name")
        _ping(uri)


def _ping(uri: str) -> None:
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=10).read()
    except OSError as exc:
        raise ConfigError(f"MLFLOW_TRACKING_URI = {uri!r} does not answer ({exc}); start it with "
                          "`make mlflow-server`") from None


def executor(params: Params, profile: Profile, name: str, *, nodes: int, tasks_per_node: int,
             cpus_per_task: int, gpus_per_node: int = 0) -> Any:
    """A submitit executor for jobs of this shape on this profile."""
    import submitit

    ex = submitit.AutoExecutor(folder=Path(params.slurm.folder).resolve() / "%j", cluster="slurm",
                               slurm_max_num_timeout=params.slurm.max_timeouts)
    extra: dict[str, Any] = {"slurm_account": profile.account} if profile.account else {}
    if gpus_per_node:
        extra["gpus_per_node"] = gpus_per_node
    ex.update_parameters(name=name, nodes=nodes, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task,
                         timeout_min=profile.time_limit_min, mem_gb=profile.mem_gb,
                         slurm_partition=profile.partition, slurm_setup=list(profile.setup),
                         slurm_signal_delay_s=profile.signal_delay_s, **extra)
    return ex


def train_executor(params: Params, profile: Profile, name: str) -> Any:
    """One task per device: num_nodes x nproc_per_node tasks."""
    t = params.train
    gpus = t.nproc_per_node if profile.gpus_per_node and t.device != "cpu" else 0
    return executor(params, profile, name, nodes=t.num_nodes, tasks_per_node=t.nproc_per_node,
                    cpus_per_task=t.threads_per_process, gpus_per_node=gpus)


class TrainJob:
    """The callable each SLURM task runs: one rank of the training job; checkpointable."""

    def __init__(self, params: Params, data_dir: str, out_dir: str, evaluate: bool = False) -> None:
        self.params, self.data_dir, self.out_dir, self.evaluate = params, data_dir, out_dir, evaluate

    def __call__(self) -> dict[str, Any]:
        import submitit

        from scalelab import evaluate, train
        from scalelab.signals import StopFlag

        # cuda devices: one task per GPU, picked by LOCAL_RANK in engine.setup_process
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        # submitit's folder with %j resolved, for the provenance tag launch.submitit_folder
        os.environ["SUBMITIT_FOLDER"] = str(submitit.JobEnvironment().paths.folder)
        requeue = signal.getsignal(signal.SIGUSR2)   # submitit's: checkpoint() + scontrol requeue
        stop = StopFlag().arm(signal.SIGUSR2)        # ours: only sets a flag; the loop acts on it
        summary = train.run(self.params, self.data_dir, self.out_dir, stop=stop)
        rank = int(os.environ["RANK"])
        if summary["preempted"]:
            if rank == 0 and callable(requeue):
                requeue(signal.SIGUSR2, None)  # the checkpoint is on disk: requeue (and exit)
            time.sleep(300)  # other ranks wait for the requeue to end them; no stale result
            raise RuntimeError("preempted, but the job was not requeued within 300 s")
        if self.evaluate and rank == 0:
            summary["eval"] = evaluate.run(self.params, self.data_dir, self.out_dir,
                                           Path(self.out_dir) / "eval.json")
        return summary

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on rank 0 before requeueing: the state is already on disk."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def wait(job: Any, poll_s: float, out=sys.stderr) -> Any:
    """Streams the job's state and rank 0's new log lines until it ends; returns its result."""
    seen, last_state = 0, None
    while True:
        state = job.state
        if state != last_state:
            print(f"slurm job {job.job_id}: {state}", file=out, flush=True)
            last_state = state
        seen = _tail(Path(job.paths.stderr), seen, out)
        if job.done():
            break
        time.sleep(poll_s)
    _tail(Path(job.paths.stderr), seen, out)
    return job.results()[0]  # rank 0's summary


def _tail(path: Path, seen: int, out: Any) -> int:
    try:
        with path.open("rb") as fh:
            fh.seek(seen)
            chunk = fh.read()
    except OSError:
        return seen
    for line in chunk.decode(errors="replace").splitlines()[-20:]:
        if line.strip() and "\r" not in line:
            print(f"  | {line}", file=out, flush=True)
    return seen + len(chunk)


def error_line(job: Any) -> str:
    """The exception line of a job's rank-0 stderr, else its last lines."""
    import re

    try:
        lines = [ln for ln in Path(job.paths.stderr).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    raised = [ln for ln in lines if re.match(r"^(\[rank\d+\]: )?[\w.]+(Error|Exception|Exit)\b", ln)]
    return (raised[-1] if raised else " | ".join(lines[-3:]))[:1000]


class BenchJob:
    """One speedup-study cell (or the all-reduce benchmark) as a SLURM job."""

    def __init__(self, kind: str, spec: dict[str, Any]) -> None:
        self.kind, self.spec = kind, spec

    def __call__(self) -> dict[str, Any]:
        import submitit

        from scalelab import bench

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        result = (bench.time_allreduce if self.kind == "allreduce" else bench.time_steps)(self.spec)
        result.pop("is_main")
        return result


def run_cells(params: Params, items: list[tuple[str, Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Submits every cell at once; `--dependency=singleton` runs them one at a time, so that no
    two cells' timings overlap. Returns one result per item, in order."""
    profile = load_profile(params.slurm.profile)
    jobs = []
    for kind, cell, spec in items:
        per_node = cell.world_size // cell.nodes if cell.strategy == "ddp" else 1
        gpus = (cell.world_size if cell.strategy == "dp" else per_node) if cell.device == "cuda" else 0
        ex = executor(params, profile, "scalelab-speedup", nodes=cell.nodes, tasks_per_node=per_node,
                      cpus_per_task=cell.threads_per_process, gpus_per_node=gpus)
        ex.update_parameters(slurm_additional_parameters={"dependency": "singleton"})
        jobs.append(ex.submit(BenchJob(kind, spec)))
    if jobs:
        print(f"submitted {len(jobs)} study cells as SLURM jobs {', '.join(j.job_id for j in jobs)}", flush=True)
    results = []
    for job in jobs:
        try:
            results.append({"status": "ok", **wait(job, params.slurm.poll_interval_s)})
        except Exception:
            results.append({"status": "failed", "reason": error_line(job)})
    return results
