"""The one shape check: does a job of this shape fit this machine or this cluster profile?

Params validation (`scalelab train`), the SLURM pre-flight and the study's planner all call
`check_shape`, so the three can never disagree about what fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.config import TrainConfig, strategies
from scalelab.runtime.device import cpu_count, cuda_device_count


@dataclass(frozen=True, slots=True, kw_only=True)
class JobShape:
    strategy: str  # a name in config.strategies (single | dp | ddp | fsdp)
    device: str  # auto | cpu | cuda
    nodes: int = 1
    procs_per_node: int = 1  # devices per node: one process each (ddp, fsdp), or all of the one process (dp)
    threads_per_process: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    where: str  # "this machine", or "profile 'local'"

    def device(self, requested: str) -> str:
        """'auto' resolved against this capacity: cuda where the nodes have GPUs."""
        return ("cuda" if self.gpus_per_node else "cpu") if requested == "auto" else requested


def train_shape(t: TrainConfig) -> JobShape:
    """The shape of the training job that params `train.*` describe."""
    return JobShape(
        strategy=t.strategy,
        device=t.device,
        nodes=t.num_nodes,
        procs_per_node=t.nproc_per_node,
        threads_per_process=t.threads_per_process,
    )


def local_capacity() -> Capacity:
    """This machine: one node, its usable cores and visible GPUs."""
    return Capacity(nodes=1, cpus_per_node=cpu_count(), gpus_per_node=cuda_device_count(), where="this machine")


@dataclass(frozen=True, slots=True)
class Misfit:
    """Why a shape does not fit: the params field at fault, its value, the reason and the fix."""

    field: str
    value: object
    reason: str  # a sentence of its own ("nn.DataParallel needs >= 2 CUDA devices; ...")
    fix: str

    def message(self, prefix: str) -> str:
        """The one-line error for params key `prefix.field`."""
        return f"{prefix}.{self.field} = {self.value!r} is not allowed: {self.reason}; {self.fix}"


def check_shape(shape: JobShape, cap: Capacity) -> Misfit | None:
    """The first way `shape` does not fit `cap`, or None when it fits."""
    device, gpus, cores, where = cap.device(shape.device), cap.gpus_per_node, cap.cpus_per_node, cap.where
    strategy = strategies.get(shape.strategy)
    procs = strategy.processes(shape.procs_per_node)  # processes per node
    if shape.nodes > cap.nodes:
        return Misfit(
            "num_nodes", shape.nodes, f"needs {shape.nodes} nodes; {where} has {cap.nodes}", f"use at most {cap.nodes}"
        )
    if device == "cuda" and gpus == 0:
        return Misfit("device", "cuda", f"needs a CUDA device; {where} has none", "use 'auto' or 'cpu'")
    if gpus < strategy.min_cuda_devices:
        reason = f"{strategy.wrapper} needs >= {strategy.min_cuda_devices} CUDA devices; {where} has {gpus}"
        return Misfit("strategy", strategy.name, reason, "use 'single' or 'ddp'")
    if strategy.cuda_only and device == "cpu":
        reason = f"{strategy.wrapper} runs on CUDA devices only"
        return Misfit("device", "cpu", reason, "use 'auto' or 'cuda', or strategy 'single' or 'ddp'")
    if strategy.parallel and device == "cuda" and shape.procs_per_node > gpus:
        return Misfit(
            "nproc_per_node",
            shape.procs_per_node,
            f"needs {shape.procs_per_node} GPUs per node; {where} has {gpus}",
            f"use at most {gpus}",
        )
    if strategy.distributed and device == "cpu" and procs > cores:
        return Misfit(
            "nproc_per_node",
            procs,
            f"needs {procs} processes of >= 1 core each per node; {where} has {cores} CPU cores",
            f"use at most {cores}",
        )
    if shape.threads_per_process * procs > cores:
        return Misfit(
            "threads_per_process",
            shape.threads_per_process,
            f"{shape.threads_per_process} threads x {procs} process(es) need "
            f"{shape.threads_per_process * procs} cores per node; {where} has {cores} CPU cores",
            f"use at most {max(1, cores // procs)}",
        )
    return None
