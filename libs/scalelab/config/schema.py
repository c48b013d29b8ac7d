"""The schema of params.yaml: one frozen dataclass per stage section.

`load_params("params.yaml")` is the one entry point; every stage calls it before doing anything.
Nothing here probes the machine: the job's shape is checked against the cores, GPUs or cluster
profile by `scalelab.launch.shape.check_shape`, before any process or job starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalelab.config import registry
from scalelab.config.checkpoints import (  # noqa: F401 (re-exported: where checkpoints live and resume from)
    CHECKPOINT_NAME,
    checkpoint_dir_problem,
    resume_from_error,
    resume_from_problem,
)
from scalelab.config.data_schema import (  # noqa: F401 (re-exported: the data section)
    DATA_KINDS,
    FROZEN,
    GLOB_CHARACTERS,
    MAX_SEED,
    SCORES,
    VOCAB_SIZES,
    DataConfig,
    FileConfig,
    JsonlConfig,
    SyntheticConfig,
    TextConfig,
)
from scalelab.config.loader import ConfigError, build, check_name, knob, read_yaml
from scalelab.config.names import LR_SCHEDULES, OPTIMIZERS
from scalelab.config.strategies import STRATEGIES
from scalelab.config.strategies import get as get_strategy

StrategyName = Literal[tuple(STRATEGIES)]  # the registered strategies (config/strategies.py)
OptimizerName = Literal[tuple(OPTIMIZERS)]  # config/names.py
LrScheduleName = Literal[tuple(LR_SCHEDULES)]  # config/names.py
Precision = Literal["fp32", "bf16", "fp16"]


@dataclass(**FROZEN)
class TrackingConfig:
    experiment: str = knob("scalelab", doc="MLflow experiment name")
    enabled: bool = knob(True, doc="false uses the no-op tracker")
    system_metrics_interval_s: float = knob(
        10.0,
        ge=0.0,
        doc="seconds between system-metrics samples on each node (MLflow's SystemMetricsMonitor); 0 turns them off",
    )
    run_id: str = knob("", doc="log into this existing run (set by `scalelab sweep` per element)")
    upload_untracked: bool = knob(
        False,
        doc="store untracked files' contents (provenance/untracked.diff, for reproduce); false: their names only, "
        "and a run with any is not reproducible",
    )

    def check(self, prefix: str) -> None:
        check_name(f"{prefix}.experiment", self.experiment)


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
    strategy: StrategyName = knob("ddp", doc=" | ".join(STRATEGIES) + " (config/strategies.py)")
    launcher: Literal["local", "slurm"] = knob("local")
    nproc_per_node: int = knob(2, ge=1, doc="processes (ddp, fsdp) or devices (dp) per node")
    num_nodes: int = knob(1, ge=1, doc="> 1 needs launcher slurm")
    threads_per_process: int = knob(1, ge=1)
    device: Literal["auto", "cpu", "cuda"] = knob("auto")
    seed: int = knob(0, ge=0, le=MAX_SEED)
    deterministic: bool = knob(True, doc="torch.use_deterministic_algorithms")
    epochs: int = knob(30, ge=1)
    batch_size: int = knob(64, ge=1, doc="samples per rank per micro-step")
    grad_accum_steps: int = knob(1, ge=1)
    optimizer: OptimizerName = knob("adamw", doc=" | ".join(OPTIMIZERS) + " (config/names.py)")
    lr: float = knob(3e-3, gt=0.0)
    momentum: float = knob(0.9, ge=0.0, lt=1.0)
    weight_decay: float = knob(0.0, ge=0.0)
    precision: Precision = knob("fp32")
    num_workers: int = knob(0, ge=0, doc="DataLoader worker processes per rank")
    untimed_steps: int = knob(5, ge=0, doc="first steps left out of throughput figures (not an LR warm-up)")
    lr_schedule: LrScheduleName = knob(
        "constant", doc=" | ".join(LR_SCHEDULES) + " after lr_warmup_steps (config/names.py)"
    )
    lr_warmup_steps: int = knob(0, ge=0, doc="optimizer steps of linear LR warm-up from lr / lr_warmup_steps to lr")
    lr_decay_fraction: float = knob(
        0.2, gt=0.0, le=1.0, doc="wsd: the share of the steps after the warm-up spent decaying; the rest is stable"
    )
    min_lr_ratio: float = knob(0.0, ge=0.0, le=1.0, doc="the decayed LR at the last step, as a fraction of lr")
    grad_clip_norm: float = knob(0.0, ge=0.0, doc="clip the global gradient norm to this; 0 turns clipping off")
    best_metric: str = knob("val_loss", doc="a validation metric (val_loss, val_accuracy, ...) that picks best.pt")
    best_mode: Literal["min", "max"] = knob("min", doc="min: lower best_metric is better; max: higher")
    early_stop_patience: int = knob(
        0, ge=0, doc="stop after this many validations without a better best_metric; 0 is off"
    )
    activation_checkpointing: bool = knob(False, doc="recompute each shard unit's activations in backward")
    log_every_steps: int = knob(10, ge=1, doc="metrics are aggregated over this many steps")
    checkpoint_every_steps: int = knob(50, ge=1)
    keep_checkpoints: int = knob(2, ge=2)
    resume_from: str = knob(
        "",
        doc="'': off; else a folder of checkpoints (e.g. results/train/checkpoints/stale-<fingerprint>, where "
        "checkpoints of other params, data or code are moved) that a job with none of its own resumes from",
    )
    async_checkpoint: bool = knob(False, doc="write checkpoints in a background thread, overlapping the next steps")
    checkpoint_dir: str = knob(
        "",
        doc="'': <out>/checkpoints; a folder; an fsspec URL (s3://bucket/prefix); or 'store': "
        "<the clone's store>/checkpoints/<fingerprint>, where a job resumes from any machine",
    )
    collective_timeout_s: float = knob(
        300.0,
        gt=0.0,
        doc="a collective waiting this long for a peer (a hung or stopped rank) fails the job instead of hanging it",
    )
    profile: ProfileConfig = knob(ProfileConfig())
    sample_tokens: int = knob(
        64, ge=0, doc="a token workload samples this many tokens at each validation, logged as samples/; 0: off"
    )

    @property
    def world_size(self) -> int:
        """Processes taking part: nodes x processes per node for ddp and fsdp, one for single and dp."""
        return get_strategy(self.strategy).processes(self.num_nodes * self.nproc_per_node)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        return self.batch_size * self.grad_accum_steps * self.world_size

    def check(self, prefix: str) -> None:
        strategy = get_strategy(self.strategy)
        if not strategy.distributed and self.num_nodes > 1:
            spanning = " and ".join(n for n, s in STRATEGIES.items() if s.distributed)
            raise ConfigError(
                f"{prefix}.num_nodes = {self.num_nodes} is not allowed with "
                f"{prefix}.strategy = '{self.strategy}': only {spanning} span nodes"
            )
        if not strategy.parallel and self.nproc_per_node != 1:
            raise ConfigError(
                f"{prefix}.nproc_per_node = {self.nproc_per_node} is not allowed "
                f"with {prefix}.strategy = '{self.strategy}': set it to 1"
            )
        if strategy.cuda_only and self.device == "cpu":
            raise ConfigError(
                f"{prefix}.device = 'cpu' is not allowed with {prefix}.strategy = '{self.strategy}': "
                f"{strategy.wrapper} runs on CUDA devices only; use 'auto' or 'cuda', or strategy 'single' or 'ddp'"
            )
        if self.activation_checkpointing and not strategy.activation_checkpointing:
            raise ConfigError(
                f"{prefix}.activation_checkpointing = true is not allowed with {prefix}.strategy = "
                f"'{self.strategy}': its replica threads would share the checkpoint wrapper's state; use false, "
                "or strategy 'ddp' or 'fsdp'"
            )
        odd = any(c in self.resume_from for c in GLOB_CHARACTERS + "\n")
        if odd or CHECKPOINT_NAME.match(Path(self.resume_from).name):
            raise ConfigError(
                f"{prefix}.resume_from = {self.resume_from!r} is not allowed: give '' (off) or the folder that holds "
                "step-XXXXXXXX.pt or .dcp checkpoints, e.g. results/train/checkpoints/stale-<fingerprint>"
            )
        problem = checkpoint_dir_problem(self.checkpoint_dir)
        if problem is not None:
            raise ConfigError(
                f"{prefix}.checkpoint_dir = {self.checkpoint_dir!r} is not allowed: {problem}; give '' "
                "(<out>/checkpoints), 'store' (<the clone's store>/checkpoints/<fingerprint>), a folder, or an "
                "fsspec URL such as s3://bucket/prefix"
            )
        if self.num_nodes > 1 and self.launcher != "slurm":
            raise ConfigError(
                f"{prefix}.num_nodes = {self.num_nodes} needs {prefix}.launcher = 'slurm' (local runs use one node)"
            )


@dataclass(**FROZEN)
class EvaluateConfig:
    batch_size: int = knob(512, ge=1)
    checkpoint: Literal["last", "best"] = knob(
        "last", doc="score model.pt (the last step) or best.pt (train.best_metric)"
    )


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
    batch_sizes: list[int] = knob(
        [4096], doc="per rank (weak) or global (strong); the first is the reference of the article's table"
    )
    precisions: list[Precision] = knob(["fp32"], doc="fp32 | bf16 (autocast) | fp16 (GradScaler, CUDA only)")
    compile: list[bool] = knob([False], doc="torch.compile off and/or on; compile time is reported apart")
    activation_checkpointing: list[bool] = knob(
        [False], doc="off and/or on: each shard unit recomputes its activations in backward (memory per rank)"
    )
    strategies: list[StrategyName] = knob(list(STRATEGIES))
    world_sizes: list[int] | Literal["auto"] = knob("auto", doc="auto: 1..GPUs on CUDA, 1..cores on CPU")
    device: Literal["auto", "cpu", "cuda"] = knob("auto")
    launcher: Literal["local", "slurm"] = knob("local", doc="slurm: every cell is a job on slurm.profile")
    nodes: list[int] = knob([1], doc="node counts for ddp and fsdp cells (> 1 needs launcher slurm)")
    seed: int = knob(0, ge=0, le=MAX_SEED)
    warmup_steps: int = knob(3, ge=1)
    timed_steps: int = knob(5, ge=1)
    repeats: int = knob(3, ge=1)
    max_others_cpu_share: float = knob(
        0.25, gt=0.0, le=1.0, doc="a repeat while other processes (and steal) held more of the cores is busy: retried"
    )
    max_retries: int = knob(
        3, ge=0, doc="extra repeats per cell in place of busy ones; past them busy ones are dropped"
    )
    max_warm_cells: int = knob(
        8, ge=1, doc="cells whose ranks wait warm at once (~0.5 GB per rank); more are measured in waves"
    )
    work_samples: int = knob(1_000_000, ge=1, doc="the fixed work behind the 'training time' column")
    baseline: Literal["single-t1", "single-all"] = knob("single-t1", doc="the speedup column's baseline")
    interconnects: dict[str, Interconnect] = knob(
        {
            "nvlink4": Interconnect(bandwidth_gb_s=370.0, latency_us=3.0),
            "ib_hdr": Interconnect(bandwidth_gb_s=24.0, latency_us=5.0),
        }
    )
    predict_world_sizes: list[int] = knob([8, 64, 512])

    def check(self, prefix: str) -> None:
        bad = [w for w in ([] if self.world_sizes == "auto" else self.world_sizes) if w < 1]
        if bad:
            raise ConfigError(f"{prefix}.world_sizes = {self.world_sizes} is not allowed: sizes must be >= 1")
        if self.launcher == "local" and self.nodes != [1]:
            raise ConfigError(
                f"{prefix}.nodes = {self.nodes} is not allowed with {prefix}.launcher = "
                "'local': cells on more than one node need launcher 'slurm'"
            )
        if not self.nodes or min(self.nodes) < 1:
            raise ConfigError(f"{prefix}.nodes = {self.nodes} is not allowed: give node counts >= 1")
        for key, values, allowed in (
            ("strategies", self.strategies, ", ".join(STRATEGIES)),
            ("precisions", self.precisions, "fp32, bf16, fp16"),
            ("compile", self.compile, "false, true"),
            ("activation_checkpointing", self.activation_checkpointing, "false, true"),
            ("batch_sizes", self.batch_sizes, "per-rank batches >= 1"),
        ):
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{prefix}.{key} = {values} is not allowed: give one or more of {allowed}, each once")
        if min(self.batch_sizes) < 1:
            raise ConfigError(f"{prefix}.batch_sizes = {self.batch_sizes} is not allowed: batches must be >= 1")


@dataclass(**FROZEN)
class SlurmConfig:
    """Used when train.launcher = 'slurm' and by `scalelab sweep`."""

    profile: str = knob("local", doc="a cluster profile: slurm/profiles/<name>.yaml")
    folder: str = knob("results/slurm", doc="submitit logs and job pickles (one folder per job)")
    max_timeouts: int = knob(3, ge=0, doc="requeues allowed after a time-limit signal")
    poll_interval_s: float = knob(5.0, gt=0.0)
    est_step_time_s: float = knob(1.0, gt=0.0, doc="rough step time, for the pre-flight check only")
    stop_check_every_steps: int = knob(
        10, ge=1, doc="steps between the ranks' checks for a preemption signal (a collective; results/bench)"
    )

    def check(self, prefix: str) -> None:
        check_name(f"{prefix}.profile", self.profile)  # a name under slurm/profiles/, never a path


@dataclass(**FROZEN)
class SweepConfig:
    """`scalelab sweep`: a grid as a SLURM job array, or a search (tpe, random) with pruning."""

    array_parallelism: int = knob(4, ge=1, doc="SLURM array elements running at once (--parallel overrides)")
    evaluate: bool = knob(True, doc="score each element on the test split inside its job")
    launcher: Literal["slurm", "local"] = knob(
        "slurm", doc="where a search runs its trials: SLURM array elements, or processes on this machine"
    )
    storage: str = knob("", doc="the Optuna study's database URL (postgresql://...); empty: a journal file")
    heartbeat_timeout_s: float = knob(
        300.0, gt=0.0, doc="a running trial silent this long (its job died) is marked failed and replaced"
    )


@dataclass(**FROZEN)
class Params:
    tracking: TrackingConfig = knob(TrackingConfig())
    data: DataConfig = knob(DataConfig())
    train: TrainConfig = knob(TrainConfig())
    evaluate: EvaluateConfig = knob(EvaluateConfig())
    speedup: SpeedupConfig = knob(SpeedupConfig())
    slurm: SlurmConfig = knob(SlurmConfig())
    sweep: SweepConfig = knob(SweepConfig())


def load_params(path: str | Path = "params.yaml") -> Params:
    """Reads and validates params.yaml, including the workload's model section."""
    return parse_params(read_yaml(path), str(path))


def parse_params(raw: Any, source: str) -> Params:
    """Validates an already-read params tree; errors are prefixed with `source`."""
    if raw is None:
        raise ConfigError(f"{source} is empty: give the params sections (tracking, data, train, ...)")
    try:
        params = build(Params, raw)
        model = registry.check_config(params.train.workload, params.train.model, "train")
        vocab = VOCAB_SIZES[params.data.section.tokenizer] if params.data.kind == "tokens" else None
        registry.check_data(params.train.workload, model, params.data.source, params.data.kind, vocab)
        check_best_metric(params.train.best_metric, params.data)
        registry.check_config(params.speedup.workload, params.speedup.model, "speedup")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return params


def check_best_metric(metric: str, data: DataConfig) -> None:
    """`train.best_metric` is one of the metrics validation logs for this kind of data."""
    allowed = [f"val_{score}" for score in SCORES[data.kind]]
    if metric not in allowed:
        raise ConfigError(
            f"train.best_metric = {metric!r} is not allowed with data.source = {data.source!r}: "
            f"give one of {', '.join(allowed)}"
        )
