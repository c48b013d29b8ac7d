"""The schema of params.yaml: one frozen dataclass per stage section.

`load_params("params.yaml")` is the one entry point; every stage calls it before doing anything.
Checks that depend on this machine (CPU cores, CUDA devices) live in `check_runtime`, which
launchers call before they start a process or a job.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalelab.config import ConfigError, build, knob, read_yaml

Strategy = Literal["single", "dp", "ddp"]
Precision = Literal["fp32", "bf16", "fp16"]

FROZEN = dict(frozen=True, kw_only=True, slots=True)


@dataclass(**FROZEN)
class TrackingConfig:
    experiment: str = knob("scalelab", doc="MLflow experiment name")
    enabled: bool = knob(True, doc="false uses the no-op tracker")
    system_metrics_interval_s: float = knob(10.0, ge=0.0, doc="seconds between system-metrics samples "
                                            "on each node (MLflow's SystemMetricsMonitor); 0 turns them off")
    run_id: str = knob("", doc="log into this existing run (set by `scalelab sweep` per element)")


@dataclass(**FROZEN)
class SyntheticConfig:
    num_samples: int = knob(4096, ge=10)
    num_features: int = knob(32, ge=1)
    num_classes: int = knob(10, ge=2)
    noise: float = knob(1.0, ge=0.0, doc="std of the Gaussian noise around each class centre")


@dataclass(**FROZEN)
class FileConfig:
    path: str = knob("", doc="CSV or Parquet file; every column but the label is a feature")
    label_column: str = knob("label")


@dataclass(**FROZEN)
class DataConfig:
    source: Literal["digits", "synthetic", "file"] = knob("digits")
    seed: int = knob(0, ge=0, doc="seed of the synthetic generator and of the split")
    val_fraction: float = knob(0.1, gt=0.0, lt=0.5)
    test_fraction: float = knob(0.2, gt=0.0, lt=0.5)
    synthetic: SyntheticConfig = knob(SyntheticConfig())
    file: FileConfig = knob(FileConfig())

    def check(self, prefix: str) -> None:
        if self.source == "file" and not self.file.path:
            raise ConfigError(f"{prefix}.file.path = '' is not allowed when {prefix}.source = "
                              "'file': give the CSV or Parquet path")


@dataclass(**FROZEN)
class ProfileConfig:
    enabled: bool = knob(False)
    wait: int = knob(1, ge=0)
    warmup: int = knob(1, ge=0)
    active: int = knob(3, ge=1)


@dataclass(**FROZEN)
class TrainConfig:
    workload: str = knob("mlp", doc="a module in experiments/")
    model: dict[str, Any] = knob({}, doc="the workload's Config, checked by the workload")
    strategy: Strategy = knob("ddp")
    launcher: Literal["local", "slurm"] = knob("local")
    nproc_per_node: int = knob(2, ge=1, doc="processes (ddp) or devices (dp) per node")
    num_nodes: int = knob(1, ge=1, doc="> 1 needs launcher slurm")
    threads_per_process: int = knob(1, ge=1)
    device: Literal["auto", "cpu", "cuda"] = knob("auto")
    seed: int = knob(0, ge=0)
    deterministic: bool = knob(True, doc="torch.use_deterministic_algorithms")
    epochs: int = knob(30, ge=1)
    batch_size: int = knob(64, ge=1, doc="samples per rank per micro-step")
    grad_accum_steps: int = knob(1, ge=1)
    optimizer: Literal["sgd", "adamw"] = knob("adamw")
    lr: float = knob(3e-3, gt=0.0)
    momentum: float = knob(0.9, ge=0.0, lt=1.0)
    weight_decay: float = knob(0.0, ge=0.0)
    precision: Precision = knob("fp32")
    num_workers: int = knob(0, ge=0, doc="DataLoader worker processes per rank")
    warmup_steps: int = knob(5, ge=0, doc="steps left out of throughput figures")
    log_every_steps: int = knob(10, ge=1, doc="metrics are aggregated over this many steps")
    checkpoint_every_steps: int = knob(50, ge=1)
    keep_checkpoints: int = knob(2, ge=2)
    profile: ProfileConfig = knob(ProfileConfig())

    def check(self, prefix: str) -> None:
        if self.strategy != "ddp" and self.num_nodes > 1:
            raise ConfigError(f"{prefix}.num_nodes = {self.num_nodes} is not allowed with "
                              f"{prefix}.strategy = '{self.strategy}': only ddp spans nodes")
        if self.strategy == "single" and self.nproc_per_node != 1:
            raise ConfigError(f"{prefix}.nproc_per_node = {self.nproc_per_node} is not allowed "
                              f"with {prefix}.strategy = 'single': set it to 1")
        if self.num_nodes > 1 and self.launcher != "slurm":
            raise ConfigError(f"{prefix}.num_nodes = {self.num_nodes} needs "
                              f"{prefix}.launcher = 'slurm' (local runs use one node)")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.nproc_per_node if self.strategy == "ddp" else 1


@dataclass(**FROZEN)
class EvaluateConfig:
    batch_size: int = knob(512, ge=1)


@dataclass(**FROZEN)
class Interconnect:
    bandwidth_gb_s: float = knob(24.0, gt=0.0, doc="per-link all-reduce bus bandwidth, GB/s")
    latency_us: float = knob(5.0, ge=0.0, doc="per-message latency, microseconds")


@dataclass(**FROZEN)
class SpeedupConfig:
    """The speedup study (stage `speedup`): strategies x world sizes, measured side by side."""

    workload: str = knob("mlp")
    model: dict[str, Any] = knob({"hidden": [512, 512, 512], "dropout": 0.0})
    num_features: int = knob(512, ge=1, doc="synthetic input width")
    num_classes: int = knob(10, ge=2)
    scaling: Literal["weak", "strong"] = knob("weak", doc="weak: fixed per-rank batch; strong: fixed global batch")
    batch_size: int = knob(4096, ge=1, doc="per rank (weak) or global (strong)")
    precision: Precision = knob("fp32")
    strategies: list[Strategy] = knob(["single", "dp", "ddp"])
    world_sizes: list[int] | Literal["auto"] = knob("auto", doc="auto: 1..GPUs on CUDA, 1..cores on CPU")
    device: Literal["auto", "cpu", "cuda"] = knob("auto")
    launcher: Literal["local", "slurm"] = knob("local", doc="slurm: every cell is a job on slurm.profile")
    nodes: list[int] = knob([1], doc="node counts for ddp cells (> 1 needs launcher slurm)")
    seed: int = knob(0, ge=0)
    warmup_steps: int = knob(3, ge=1)
    timed_steps: int = knob(5, ge=1)
    repeats: int = knob(3, ge=1)
    work_samples: int = knob(1_000_000, ge=1, doc="the fixed work behind the 'training time' column")
    baseline: Literal["single-t1", "single-all"] = knob("single-t1", doc="the speedup column's baseline")
    interconnects: dict[str, Interconnect] = knob({
        "nvlink4": Interconnect(bandwidth_gb_s=370.0, latency_us=3.0),
        "ib_hdr": Interconnect(bandwidth_gb_s=24.0, latency_us=5.0)})
    predict_world_sizes: list[int] = knob([8, 64, 512])

    def check(self, prefix: str) -> None:
        bad = [w for w in ([] if self.world_sizes == "auto" else self.world_sizes) if w < 1]
        if bad:
            raise ConfigError(f"{prefix}.world_sizes = {self.world_sizes} is not allowed: sizes must be >= 1")
        if self.launcher == "local" and self.nodes != [1]:
            raise ConfigError(f"{prefix}.nodes = {self.nodes} is not allowed with {prefix}.launcher = "
                              "'local': cells on more than one node need launcher 'slurm'")
        if not self.nodes or min(self.nodes) < 1:
            raise ConfigError(f"{prefix}.nodes = {self.nodes} is not allowed: give node counts >= 1")
        if not self.strategies:
            raise ConfigError(f"{prefix}.strategies = [] is not allowed: give one or more of single, dp, ddp")


@dataclass(**FROZEN)
class SlurmConfig:
    """Used when train.launcher = 'slurm' and by `scalelab sweep`."""

    profile: str = knob("local", doc="a cluster profile: slurm/profiles/<name>.yaml")
    folder: str = knob("results/slurm", doc="submitit logs and job pickles (one folder per job)")
    max_timeouts: int = knob(3, ge=0, doc="requeues allowed after a time-limit signal")
    poll_interval_s: float = knob(5.0, gt=0.0)
    est_step_time_s: float = knob(1.0, gt=0.0, doc="rough step time, for the pre-flight check only")


@dataclass(**FROZEN)
class SweepConfig:
    array_parallelism: int = knob(4, ge=1, doc="SLURM array elements running at once")
    evaluate: bool = knob(True, doc="score each element on the test split inside its job")


@dataclass(**FROZEN)
class Params:
    tracking: TrackingConfig = knob(TrackingConfig())
    data: DataConfig = knob(DataConfig())
    train: TrainConfig = knob(TrainConfig())
    evaluate: EvaluateConfig = knob(EvaluateConfig())
    speedup: SpeedupConfig = knob(SpeedupConfig())
    slurm: SlurmConfig = knob(SlurmConfig())
    sweep: SweepConfig = knob(SweepConfig())

    def replace(self, **sections: Any) -> "Params":
        return dataclasses.replace(self, **sections)


def load_params(path: str | Path = "params.yaml") -> Params:
    """Reads and validates params.yaml, including the workload's model section."""
    from scalelab import workloads  # the workload schema lives with the workload

    raw = read_yaml(path)
    try:
        params = build(Params, raw)
        workloads.check_config(params.train.workload, params.train.model, "train")
        workloads.check_config(params.speedup.workload, params.speedup.model, "speedup")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return params


def cpu_count() -> int:
    """CPU cores this process may use (affinity-aware)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(train: TrainConfig) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'."""
    if train.device == "auto":
        return "cuda" if cuda_device_count() > 0 else "cpu"
    return train.device


def check_runtime(train: TrainConfig, prefix: str = "train") -> None:
    """Checks the train section against this machine; call before starting any process.

    Raises:
        ConfigError: too many processes for the cores or GPUs, or a missing GPU.
    """
    device, gpus, cores = resolve_device(train), cuda_device_count(), cpu_count()
    if train.launcher == "slurm":
        return  # checked against the cluster profile by the SLURM pre-flight
    if device == "cuda" and gpus == 0:
        raise ConfigError(f"{prefix}.device = 'cuda' is not allowed: no CUDA device is visible; "
                          "use 'auto' or 'cpu'")
    if train.strategy == "dp" and gpus < 2:
        raise ConfigError(f"{prefix}.strategy = 'dp' needs >= 2 CUDA devices, found {gpus}; "
                          "use 'single' or 'ddp'")
    if train.strategy in ("dp", "ddp") and device == "cuda" and train.nproc_per_node > gpus:
        raise ConfigError(f"{prefix}.nproc_per_node = {train.nproc_per_node} is more than the "
                          f"{gpus} visible GPUs; use at most {gpus}")
    if train.strategy == "ddp" and device == "cpu" and train.nproc_per_node > cores:
        raise ConfigError(f"{prefix}.nproc_per_node = {train.nproc_per_node} is more than the "
                          f"{cores} CPU cores; use at most {cores}")
    if device == "cpu" and train.threads_per_process * train.nproc_per_node > cores:
        raise ConfigError(f"{prefix}.threads_per_process = {train.threads_per_process} x "
                          f"nproc_per_node = {train.nproc_per_node} is more than the {cores} CPU "
                          f"cores; lower threads_per_process to {max(1, cores // train.nproc_per_node)}")
