"""The study's grid: which cells exist, which can run here, and the key that caches each one.

A cell is one (strategy, world size, nodes, threads per process) setup. A cell that cannot run on
this machine or cluster profile carries the reason (from `launch.shape.check_shape`, the same check
that `scalelab train` uses) and is reported as skipped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from scalelab.config import SpeedupConfig, to_dict
from scalelab.launch.shape import Capacity, JobShape, check_shape
from scalelab.runtime.io import json_digest

# knobs that choose cells or shape the report, but do not change what a cell measures
REPORT_KEYS = ("strategies", "world_sizes", "baseline", "interconnects", "predict_world_sizes", "work_samples")


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    strategy: str
    world_size: int
    threads_per_process: int
    device: str
    nodes: int = 1
    reason: str = ""  # non-empty: the cell cannot run here and is reported as skipped

    @property
    def skipped(self) -> bool:
        return bool(self.reason)

    @property
    def procs_per_node(self) -> int:
        """Processes per node: ddp runs one per worker; single and dp are one process."""
        return self.world_size // self.nodes if self.strategy == "ddp" else 1


def plan(cfg: SpeedupConfig, cap: Capacity) -> list[Cell]:
    """Every cell of the grid, runnable or not (a skipped cell carries its reason)."""
    device = cap.device(cfg.device)
    gpus, cores = cap.gpus_per_node, cap.cpus_per_node
    sizes = cfg.world_sizes if cfg.world_sizes != "auto" else _auto_sizes(gpus if device == "cuda" else cores)
    cells: list[Cell] = []
    for strategy in cfg.strategies:
        if strategy == "single":
            threads = [1] if device == "cuda" else sorted({1, cores})
            cells += [
                Cell(f"single-t{t}" if device == "cpu" else "single-gpu", "single", 1, t, device) for t in threads
            ]
        for nodes in cfg.nodes if strategy == "ddp" else [1]:
            for world in (w for w in sizes if strategy != "single" and w % nodes == 0):
                if strategy == "dp" and world < 2:
                    continue
                per_node = world // nodes
                threads = 1 if device == "cuda" else max(1, cores // per_node)
                name = f"{strategy}-w{world}" if cfg.nodes == [1] else f"{strategy}-n{nodes}-w{world}"
                cell = Cell(name, strategy, world, threads, device, nodes)
                cells.append(Cell(name, strategy, world, threads, device, nodes, _why_not(cfg, cell, cap)))
    return cells


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
        procs_per_node=cell.world_size if cell.strategy == "dp" else cell.procs_per_node,
        threads_per_process=cell.threads_per_process,
    )
    misfit = check_shape(shape, cap)
    if misfit:
        return misfit.reason
    if cfg.scaling == "strong" and cfg.batch_size % cell.world_size:
        return f"strong scaling: batch_size {cfg.batch_size} does not split evenly over {cell.world_size} ranks"
    return ""


def cell_key(cfg: SpeedupConfig, cell: Cell, code: str, hardware: dict[str, str]) -> str:
    """Hash of what decides a cell's measurement: the cell, the workload, code and hardware."""
    measured = {k: v for k, v in to_dict(cfg).items() if k not in REPORT_KEYS}
    return json_digest({"cell": asdict(cell), "config": measured, "code": code, "hw": hardware}, length=16)
