"""SLURM through submitit: cluster profiles, the pre-flight check, executors, and waiting.

This backend knows nodes, tasks and SLURM, not what runs in them: the job bodies (callables that
submitit pickles) live beside the stages they run (`scalelab.training.submit.TrainJob`,
`scalelab.study.cell.CellJob`). `submit()` sends one, and `wait()` streams its state and log tail
until it ends, so `dvc repro` on a login node blocks like a local run.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from scalelab.config import FROZEN, ConfigError, Params, build, knob, read_yaml, strategies
from scalelab.launch.local import LaunchError
from scalelab.launch.shape import Capacity, check_shape, train_shape
from scalelab.runtime.paths import repo_root
from scalelab.tracking.location import uri_source
from scalelab.tracking.secrets import mask_uri

PROFILES = Path("slurm/profiles")
NCCL_SIGNALS = {"USR1"}  # NCCL installs a SIGUSR1 handler of its own
# Where rank 0 listens for its job's rendezvous (MASTER_PORT): below Linux's ephemeral ports (32768-60999,
# /proc/sys/net/ipv4/ip_local_port_range), which any outgoing connection on the node may hold. submitit's own
# choice, a port in 20000-60000 drawn from the job id, fell on one in use there (EADDRINUSE, job 22, port 49908).
PORTS = range(20000, 32768)


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
    path = (root or repo_root()) / PROFILES / f"{name}.yaml"
    if not path.is_file():
        found = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"slurm.profile = {name!r}: {path} does not exist; profiles: {', '.join(found)}")
    try:
        return build(Profile, read_yaml(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def capacity(profile: Profile, name: str) -> Capacity:
    """What one job may use on the cluster of `profile`."""
    return Capacity(
        nodes=profile.max_nodes,
        cpus_per_node=profile.cpus_per_node,
        gpus_per_node=profile.gpus_per_node,
        where=f"profile {name!r}",
    )


def preflight(params: Params, profile: Profile, uri: str) -> None:
    """Fails fast, before anything is submitted, on a job the cluster cannot run well.

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    t, s = params.train, params.slurm
    misfit = check_shape(train_shape(t), capacity(profile, s.profile))
    if misfit:
        raise ConfigError(misfit.message("train"))
    if profile.signal.upper().removeprefix("SIG") in NCCL_SIGNALS:
        raise ConfigError(
            f"profile {s.profile!r}: signal = {profile.signal!r} conflicts with NCCL, which catches SIGUSR1; use USR2"
        )
    if t.checkpoint_every_steps * s.est_step_time_s > profile.time_limit_min * 60 - profile.signal_delay_s:
        raise ConfigError(
            f"train.checkpoint_every_steps = {t.checkpoint_every_steps} x slurm.est_step_time_s = "
            f"{s.est_step_time_s} s is longer than the {profile.time_limit_min} min time limit "
            f"of profile {s.profile!r}: no checkpoint would land; checkpoint more often"
        )
    check_tracking_reachable(uri, profile, s.profile)


def check_tracking_reachable(uri: str, profile: Profile, name: str) -> None:
    """The compute nodes must reach the store: a shared SQLite path, or a server not on loopback."""
    parsed, source = urlparse(uri), f"{uri_source(uri)} = {mask_uri(uri)!r}"
    if parsed.scheme == "sqlite":
        path = Path(parsed.path if not parsed.path.startswith("//") else parsed.path[1:])
        if not any(path.resolve().is_relative_to(Path(p)) for p in profile.shared_paths):
            raise ConfigError(
                f"{source}: {path} is not under the shared paths "
                f"{profile.shared_paths} of profile {name!r}, so compute nodes cannot reach "
                "it; put the store on a shared path or run `make mlflow-server`"
            )
    elif parsed.scheme in ("http", "https"):
        if parsed.hostname in ("127.0.0.1", "localhost", "::1") and not profile.login_node_is_compute_host:
            raise ConfigError(
                f"{source} points at loopback, which compute nodes of "
                f"profile {name!r} cannot reach; use the login node's host name"
            )
        _ping(uri, source)


def _ping(uri: str, source: str) -> None:
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=10).read()
    except OSError as exc:
        raise ConfigError(f"{source} does not answer ({exc}); start it with `make mlflow-server`") from None


def executor(
    params: Params,
    profile: Profile,
    name: str,
    *,
    nodes: int,
    tasks_per_node: int,
    cpus_per_task: int,
    gpus_per_node: int = 0,
) -> Any:
    """A submitit executor for jobs of this shape on this profile."""
    import submitit

    try:
        ex = submitit.AutoExecutor(
            folder=Path(params.slurm.folder).resolve() / "%j",
            cluster="slurm",
            slurm_max_num_timeout=params.slurm.max_timeouts,
        )
    except RuntimeError as exc:  # no SLURM client here
        raise refused(exc) from None
    extra: dict[str, Any] = {"slurm_account": profile.account} if profile.account else {}
    if gpus_per_node:
        extra["gpus_per_node"] = gpus_per_node
    ex.update_parameters(
        name=name,
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        cpus_per_task=cpus_per_task,
        timeout_min=profile.time_limit_min,
        mem_gb=profile.mem_gb,
        slurm_partition=profile.partition,
        slurm_setup=list(profile.setup),
        slurm_signal_delay_s=profile.signal_delay_s,
        **extra,
    )
    return ex


def train_executor(params: Params, profile: Profile, name: str) -> Any:
    """The strategy's tasks per node (one per device for ddp and fsdp, one for dp) on
    `nproc_per_node` GPUs per node; on a GPU profile each task gets its share of the node's CPUs
    (loader workers, NCCL's threads and dp's replica threads need more than one)."""
    t = params.train
    gpus = t.nproc_per_node if profile.gpus_per_node and t.device != "cpu" else 0
    tasks = strategies.get(t.strategy).processes(t.nproc_per_node)
    cpus = max(t.threads_per_process, profile.cpus_per_node * gpus // (profile.gpus_per_node * tasks)) if gpus else 0
    return executor(
        params,
        profile,
        name,
        nodes=t.num_nodes,
        tasks_per_node=tasks,
        cpus_per_task=cpus or t.threads_per_process,
        gpus_per_node=gpus,
    )


class SubmitError(LaunchError):
    """sbatch could not be run or refused the job: nothing was queued, nothing ran."""

    exit_status = 2  # the CLI's bad input: this machine or profile cannot submit


def refused(exc: BaseException) -> SubmitError:
    """One line for a failed submission, naming what is missing when the SLURM client says it."""
    lines = str(exc).strip().splitlines()
    last = lines[-1].strip() if lines else type(exc).__name__
    if isinstance(exc, FileNotFoundError) or "Could not detect" in str(exc):  # submitit looks for srun
        return SubmitError("sbatch is not on PATH: this machine is no SLURM client (set the launcher to local)")
    if "configuration source" in str(exc) or "slurm.conf" in str(exc):
        where = os.environ.get("SLURM_CONF") or "unset"
        last = f"no SLURM configuration was found (SLURM_CONF: {where}; set it, or submit from a login node): {last}"
    return SubmitError(f"sbatch refused the job: {last}")


def rendezvous_port(job_id: int) -> int:
    """Rank 0's port for SLURM job `job_id` (every task of the job computes the same one): by the id's
    remainder, so jobs whose ids are near (those that run at once, an array's elements) never share one."""
    return PORTS[job_id % len(PORTS)]


def export_rank_env() -> None:
    """In a SLURM task: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for torch.distributed
    (submitit's TorchDistributedEnvironment), MASTER_PORT from `rendezvous_port`. They replace any that
    sbatch passed on from the submitting shell (a torchrun's there belong to another job)."""
    import submitit

    os.environ["MASTER_PORT"] = str(rendezvous_port(int(os.environ["SLURM_JOB_ID"])))
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def submit(ex: Any, fn: Any) -> Any:
    """`ex.submit(fn)`; sbatch's refusal (no cluster, bad partition, ...) is a SubmitError."""
    try:
        return ex.submit(fn)
    except Exception as exc:
        raise refused(exc) from None


def wait(job: Any, poll_s: float, out=sys.stderr) -> Any:
    """Streams the job's state and rank 0's new log lines until it ends; returns its result."""
    seen, last_state = 0, None
    while True:
        state = job.state
        if state != last_state:
            print(f"slurm job {job.job_id}: {state}", file=out, flush=True)
            last_state = state
        seen = _tail(Path(job.paths.stderr), seen, out)
        if job.done(force_check=True):  # one sacct per poll: submitit alone asks once a minute
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


ENDED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}


def has_ended(state: str) -> bool:
    """A job state (as submitit reports it, e.g. 'CANCELLED by 0') that no requeue follows."""
    return state.split(" ")[0] in ENDED_STATES


def error_line(job: Any) -> str:
    """The exception line of a job's rank-0 stderr, else its last lines."""
    try:
        lines = [ln for ln in Path(job.paths.stderr).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    raised = [ln for ln in lines if re.match(r"^(\[rank\d+\]: )?[\w.]+(Error|Exception|Exit)\b", ln)]
    return (raised[-1] if raised else " | ".join(lines[-3:]))[:1000]
