"""The study's grid: which cells exist, which can run here, and the key that caches each one.

A cell is one (strategy, world size, nodes, threads per process, precision, compile, batch) setup:
strategies x world sizes x precisions x compile x batch sizes. A cell that cannot run on this
machine or cluster profile carries the reason (from `launch.shape.check_shape`, the same check that
`scalelab train` uses, or the precision's device limit) and is reported as skipped.

A cell's name is its setup today (`single-t1`, `ddp-w2`, `fsdp-n2-w4`), plus a suffix for each
axis value off the default: `-bf16` / `-fp16`, `-compiled`, `-b<batch>` (a batch other than the
first of `batch_sizes`).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from scalelab.config import SpeedupConfig, strategies, to_dict
from scalelab.launch.shape import Capacity, JobShape, check_shape
from scalelab.runtime.io import json_digest

# knobs that choose cells or shape the report, but do not change what a cell measures
# (the axis lists are here because each cell carries its own precision, compile and batch)
REPORT_KEYS = (
    "strategies",
    "world_sizes",
    "precisions",
    "compile",
    "activation_checkpointing",
    "batch_sizes",
    "baseline",
    "interconnects",
    "predict_world_sizes",
    "work_samples",
    "max_warm_cells",  # how many cells wait warm together: the waves, not a cell's measurement
)


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    strategy: str
    world_size: int
    threads_per_process: int
    device: str
    nodes: int = 1
    precision: str = "fp32"
    compile: bool = False
    batch_size: int = 4096  # per rank (weak scaling) or global (strong), as speedup.batch_sizes
    reason: str = ""  # non-empty: the cell cannot run here and is reported as skipped
    activation_checkpointing: bool = False

    @property
    def skipped(self) -> bool:
        return bool(self.reason)

    @property
    def devices_per_node(self) -> int:
        """Workers per node: one process each under ddp and fsdp, GPUs of the one process under dp."""
        return self.world_size // self.nodes

    @property
    def procs_per_node(self) -> int:
        """Processes per node: ddp and fsdp run one per worker; single and dp are one process."""
        return strategies.get(self.strategy).processes(self.devices_per_node)


def plan(cfg: SpeedupConfig, cap: Capacity) -> list[Cell]:
    """Every cell of the grid, runnable or not (a skipped cell carries its reason). Setups come
    first; each setup's cells follow in the order of batch_sizes, precisions and compile."""
    device = cap.device(cfg.device)
    cells: list[Cell] = []
    for setup in _setups(cfg, cap, device):
        for batch, precision, compiled, ac in itertools.product(
            cfg.batch_sizes, cfg.precisions, cfg.compile, cfg.activation_checkpointing
        ):
            suffix = (
                (f"-{precision}" if precision != "fp32" else "")
                + ("-compiled" if compiled else "")
                + ("-ac" if ac else "")
                + (f"-b{batch}" if batch != cfg.batch_sizes[0] else "")
            )
            cell = Cell(
                setup.name + suffix,
                setup.strategy,
                setup.world_size,
                setup.threads_per_process,
                device,
                setup.nodes,
                precision,
                compiled,
                batch,
                activation_checkpointing=ac,
            )
            cells.append(Cell(**{**asdict(cell), "reason": _why_not(cfg, cell, cap)}))
    return cells


def _setups(cfg: SpeedupConfig, cap: Capacity, device: str) -> list[Cell]:
    """(strategy, world size, nodes, threads) setups, at the reference axis values."""
    gpus, cores = cap.gpus_per_node, cap.cpus_per_node
    sizes = cfg.world_sizes if cfg.world_sizes != "auto" else _auto_sizes(gpus if device == "cuda" else cores)
    setups: list[Cell] = []
    for name in cfg.strategies:
        strategy = strategies.get(name)
        if not strategy.parallel:  # one process on one device, at each thread count on a CPU
            threads = [1] if device == "cuda" else sorted({1, cores})
            setups += [Cell(f"{name}-t{t}" if device == "cpu" else f"{name}-gpu", name, 1, t, device) for t in threads]
            continue
        for nodes in cfg.nodes if strategy.distributed else [1]:
            worlds = [w for w in sizes if w % nodes == 0 and w >= strategy.min_cuda_devices]
            if not worlds and strategy.min_cuda_devices:  # too few GPUs: one row that says so, not none
                worlds = [strategy.min_cuda_devices]
            for world in worlds:
                per_node = world // nodes
                threads = 1 if device == "cuda" else max(1, cores // per_node)
                cell = f"{name}-w{world}" if cfg.nodes == [1] else f"{name}-n{nodes}-w{world}"
                setups.append(Cell(cell, name, world, threads, device, nodes))
    return setups


def _auto_sizes(units: int) -> list[int]:
    sizes, n = [], 1
    while n < units:
        sizes.append(n)
        n *= 2
    return sizes + [units] if units >= 1 else [1]


def _why_not(cfg: SpeedupConfig, cell: Cell, cap: Capacity) -> str:
    shape = JobShape(
        strategy=cell.strategy,
        device=cell.device,
        nodes=cell.nodes,
        procs_per_node=cell.devices_per_node,
        threads_per_process=cell.threads_per_process,
    )
    misfit = check_shape(shape, cap)
    if misfit:
        return misfit.reason
    strategy = strategies.get(cell.strategy)
    if cell.activation_checkpointing and not strategy.activation_checkpointing:
        return f"activation checkpointing under {strategy.wrapper}: its replica threads would share its state"
    if cell.precision == "fp16" and cell.device != "cuda":
        return "fp16 needs CUDA: its GradScaler and fp16 kernels are for GPUs; on CPU use bf16"
    if cfg.scaling == "strong" and cell.batch_size % cell.world_size:
        return f"strong scaling: batch {cell.batch_size} does not split evenly over {cell.world_size} ranks"
    return ""


def cell_key(cfg: SpeedupConfig, cell: Cell, code: str, hardware: dict[str, str]) -> str:
    """Hash of what decides a cell's measurement: the cell, the workload, code and hardware."""
    measured = {k: v for k, v in to_dict(cfg).items() if k not in REPORT_KEYS}
    return json_digest({"cell": asdict(cell), "config": measured, "code": code, "hw": hardware}, length=16)
