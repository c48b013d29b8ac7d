"""The speedup study: plan the cells, run those not cached, model communication, report.

    scalelab speedup --params params.yaml --out results/speedup

A cell is one (strategy, world size, nodes, threads per process) setup. Each cell's result is
cached in `<out>/cells/<name>.json` under a key that hashes the cell, the measurement params, the
code and the hardware: changing one cell reruns that cell only. Cells run one after another here
(timings must not overlap); `run_pending` takes the whole list so that a cluster backend can submit
them together.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalelab import provenance
from scalelab.config import to_dict
from scalelab.io import atomic_write_json
from scalelab.params import Params, SpeedupConfig, cpu_count, cuda_device_count

log = logging.getLogger(__name__)
# the code a cell's measurement runs: a change here re-measures every cell
CELL_CODE = [Path(__file__).parent / f"{m}.py" for m in ("bench", "engine", "strategy", "dist", "seeds", "workloads")]
EXPERIMENTS = Path(__file__).parents[2] / "experiments"


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    strategy: str
    world_size: int
    threads_per_process: int
    device: str
    nodes: int = 1
    reason: str = ""   # non-empty: the cell cannot run here and is reported as skipped

    @property
    def skipped(self) -> bool:
        return bool(self.reason)


def plan(cfg: SpeedupConfig, gpus: int, cores: int, max_nodes: int = 1) -> list[Cell]:
    """Every cell of the grid, runnable or not (a skipped cell carries its reason).

    `gpus` and `cores` are per node: this machine's, or the SLURM profile's.
    """
    device = cfg.device if cfg.device != "auto" else ("cuda" if gpus else "cpu")
    units = gpus if device == "cuda" else cores
    sizes = cfg.world_sizes if cfg.world_sizes != "auto" else _auto_sizes(units)
    cells: list[Cell] = []
    for strategy in cfg.strategies:
        if strategy == "single":
            threads = [1] if device == "cuda" else sorted({1, cores})
            cells += [Cell(f"single-t{t}" if device == "cpu" else "single-gpu", "single", 1, t, device)
                      for t in threads]
        for nodes in (cfg.nodes if strategy == "ddp" else [1]):
            for world in (w for w in sizes if strategy != "single" and w % nodes == 0):
                if strategy == "dp" and world < 2:
                    continue
                per_node = world // nodes
                threads = 1 if device == "cuda" else max(1, cores // per_node)
                name = f"{strategy}-w{world}" if cfg.nodes == [1] else f"{strategy}-n{nodes}-w{world}"
                reason = _why_not(cfg, strategy, world, per_node, device, gpus, cores) or (
                    f"needs {nodes} nodes; the cluster profile has {max_nodes}" if nodes > max_nodes else "")
                cells.append(Cell(name, strategy, world, threads, device, nodes, reason))
    return cells


def _auto_sizes(units: int) -> list[int]:
    sizes, n = [], 1
    while n < units:
        sizes.append(n)
        n *= 2
    return sizes + [units] if units >= 1 else [1]


def _why_not(cfg: SpeedupConfig, strategy: str, world: int, per_node: int, device: str, gpus: int,
             cores: int) -> str:
    where = "this machine has" if cfg.launcher == "local" else "a node of the cluster profile has"
    if strategy == "dp" and gpus < 2:
        return f"nn.DataParallel needs >= 2 CUDA devices; {where} {gpus}"
    if device == "cuda" and per_node > gpus:
        return f"needs {per_node} GPUs per node; {where} {gpus}"
    if device == "cpu" and per_node > cores:
        return f"needs {per_node} processes of >= 1 core each per node; {where} {cores} cores"
    if cfg.scaling == "strong" and cfg.batch_size % world:
        return f"strong scaling: batch_size {cfg.batch_size} does not split evenly over {world} ranks"
    return ""


def code_hash() -> str:
    """Hash of the code that cells run (CELL_CODE and the workloads)."""
    digest = hashlib.sha256()
    for path in CELL_CODE + sorted(EXPERIMENTS.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# knobs that choose cells or shape the report, but do not change what a cell measures
REPORT_KEYS = ("strategies", "world_sizes", "baseline", "interconnects", "predict_world_sizes", "work_samples")


def cell_key(cfg: SpeedupConfig, cell: Cell, code: str, hardware: dict[str, str]) -> str:
    """Hash of what decides a cell's measurement: the cell, the workload, code and hardware."""
    measured = {k: v for k, v in to_dict(cfg).items() if k not in REPORT_KEYS}
    blob = json.dumps({"cell": asdict(cell), "config": measured, "code": code, "hw": hardware},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _spec(cfg: SpeedupConfig, cell: Cell) -> dict[str, Any]:
    return {**asdict(cell), "config": to_dict(cfg)}


def _command(kind: str, cell: Cell, spec_path: Path, out_path: Path) -> list[str]:
    worker = ["-m", "scalelab.cli", "bench-worker", kind, "--spec", str(spec_path), "--out", str(out_path)]
    if cell.strategy != "ddp":
        return [sys.executable, *worker]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={cell.world_size}", *worker]


def run_cell(kind: str, cell: Cell, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Runs one cell (or the all-reduce benchmark) in fresh processes; returns its result."""
    stem = f"{cell.name}.{kind}" if kind == "allreduce" else cell.name
    spec_path, out_path = folder / f"{stem}.spec.json", folder / f"{stem}.out.json"
    atomic_write_json(spec_path, spec)
    out_path.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(cell.threads_per_process)}
    log.info("measuring %s (%s)", stem, " ".join(_command(kind, cell, spec_path, out_path)[1:]))
    proc = subprocess.run(_command(kind, cell, spec_path, out_path), env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out_path.is_file():
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"status": "failed", "reason": f"exit {proc.returncode}: {tail}"[:500]}
    return {"status": "ok", **json.loads(out_path.read_text())}


def measure(params: Params, items: list[tuple[str, Cell, dict[str, Any]]], folder: Path) -> list[dict[str, Any]]:
    """Runs (kind, cell, spec) items: one after another here, or submitted together to SLURM."""
    if params.speedup.launcher == "slurm":
        from scalelab import slurm

        return slurm.run_cells(params, items)
    return [run_cell(kind, cell, spec, folder) for kind, cell, spec in items]


def run_pending(params: Params, cells: list[Cell], folder: Path, keys: dict[str, str]) -> dict[str, dict]:
    """Measures every runnable cell whose cached result is missing or stale."""
    results: dict[str, dict] = {}
    pending = []
    for cell in cells:
        cached = _cached(folder / f"{cell.name}.json", keys[cell.name])
        if cell.skipped:
            results[cell.name] = {"status": "skipped", "reason": cell.reason}
        elif cached:
            results[cell.name] = {**cached, "cached": True}
        else:
            pending.append(cell)
    measured = measure(params, [("steps", c, _spec(params.speedup, c)) for c in pending], folder)
    for cell, result in zip(pending, measured):
        result = {**result, "key": keys[cell.name]}
        if result["status"] == "ok":
            atomic_write_json(folder / f"{cell.name}.json", result)
        results[cell.name] = {**result, "cached": False}
    return {c.name: results[c.name] for c in cells}


def _cached(path: Path, key: str) -> dict | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if result.get("key") == key else None


def measure_allreduce(params: Params, cells: list[Cell], results: dict[str, dict], folder: Path,
                      code: str, hardware: dict[str, str]) -> dict | None:
    """The all-reduce microbenchmark at the largest measured ddp world size, with the model's
    gradient size; cached like a cell."""
    cfg = params.speedup
    ddp = [c for c in cells if c.strategy == "ddp" and results[c.name]["status"] == "ok" and c.world_size > 1]
    if not ddp:
        return None
    cell = max(ddp, key=lambda c: c.world_size)
    grad_bytes = results[cell.name]["grad_bytes"]
    key = cell_key(cfg, cell, code + "allreduce", hardware)
    path = folder / f"{cell.name}.allreduce.json"
    cached = _cached(path, key)
    if cached:
        return cached
    result = measure(params, [("allreduce", cell, {**_spec(cfg, cell), "grad_bytes": grad_bytes})], folder)[0]
    if result["status"] != "ok":
        log.warning("all-reduce benchmark failed: %s", result["reason"])
        return None
    result["key"] = key
    atomic_write_json(path, result)
    return result


def hardware(params: Params) -> dict[str, str]:
    """What the cells run on: this machine, or the SLURM profile's nodes."""
    if params.speedup.launcher == "slurm":
        from scalelab import slurm

        profile = slurm.load_profile(params.slurm.profile)
        return {"slurm.profile": params.slurm.profile, "slurm.partition": profile.partition,
                "env.cpu_cores": str(profile.cpus_per_node), "env.gpus_per_node": str(profile.gpus_per_node)}
    env = provenance.environment()
    return {k: env[k] for k in ("env.host", "env.cpu", "env.cpu_cores", "env.torch") if k in env} | (
        {"env.gpus": env["env.gpus"]} if "env.gpus" in env else {})


def capacity(params: Params) -> tuple[int, int, int]:
    """(GPUs per node, cores per node, nodes) the cells may use."""
    if params.speedup.launcher == "slurm":
        from scalelab import slurm

        profile = slurm.load_profile(params.slurm.profile)
        return profile.gpus_per_node, profile.cpus_per_node, profile.max_nodes
    return cuda_device_count(), cpu_count(), 1


def run(params: Params, out_dir: str | Path) -> dict[str, Any]:
    """Plans, measures (reusing cached cells), models and reports the study."""
    from scalelab import study_report

    cfg, out = params.speedup, Path(out_dir)
    folder = out / "cells"
    folder.mkdir(parents=True, exist_ok=True)
    cells = plan(cfg, *capacity(params))
    code, hw = code_hash(), hardware(params)
    keys = {c.name: cell_key(cfg, c, code, hw) for c in cells}
    results = run_pending(params, cells, folder, keys)
    comm = measure_allreduce(params, cells, results, folder, code, hw)
    return study_report.write(params, cells, results, comm, hw, out)
