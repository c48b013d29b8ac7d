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
PACKAGE_DIRS = (Path(__file__).parent, Path(__file__).parents[2] / "experiments")


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


def plan(cfg: SpeedupConfig, gpus: int, cores: int) -> list[Cell]:
    """Every cell of the grid, runnable or not (a skipped cell carries its reason)."""
    device = cfg.device if cfg.device != "auto" else ("cuda" if gpus else "cpu")
    units = gpus if device == "cuda" else cores
    sizes = cfg.world_sizes if cfg.world_sizes != "auto" else _auto_sizes(units)
    cells: list[Cell] = []
    for strategy in cfg.strategies:
        if strategy == "single":
            threads = [1] if device == "cuda" else sorted({1, cores})
            cells += [Cell(f"single-t{t}" if device == "cpu" else "single-gpu", "single", 1, t, device)
                      for t in threads]
        for world in (w for w in sizes if strategy != "single"):
            if strategy == "dp" and world < 2:
                continue
            threads = 1 if device == "cuda" else max(1, cores // world)
            cells.append(Cell(f"{strategy}-w{world}", strategy, world, threads, device,
                              reason=_why_not(cfg, strategy, world, device, gpus, cores)))
    return cells


def _auto_sizes(units: int) -> list[int]:
    sizes, n = [], 1
    while n < units:
        sizes.append(n)
        n *= 2
    return sizes + [units] if units >= 1 else [1]


def _why_not(cfg: SpeedupConfig, strategy: str, world: int, device: str, gpus: int, cores: int) -> str:
    if strategy == "dp" and gpus < 2:
        return f"nn.DataParallel needs >= 2 CUDA devices; this machine has {gpus}"
    if device == "cuda" and world > gpus:
        return f"needs {world} GPUs; this machine has {gpus}"
    if device == "cpu" and world > cores:
        return f"needs {world} processes of >= 1 core each; this machine has {cores} cores"
    if cfg.scaling == "strong" and cfg.batch_size % world:
        return f"strong scaling: batch_size {cfg.batch_size} does not split evenly over {world} ranks"
    return ""


def code_hash() -> str:
    """Hash of the scalelab and experiments sources: a code change re-measures every cell."""
    digest = hashlib.sha256()
    for folder in PACKAGE_DIRS:
        for path in sorted(folder.rglob("*.py")):
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


def run_pending(cfg: SpeedupConfig, cells: list[Cell], folder: Path, keys: dict[str, str]) -> dict[str, dict]:
    """Measures every runnable cell whose cached result is missing or stale."""
    results: dict[str, dict] = {}
    for cell in cells:
        cached = _cached(folder / f"{cell.name}.json", keys[cell.name])
        if cell.skipped:
            results[cell.name] = {"status": "skipped", "reason": cell.reason}
        elif cached:
            results[cell.name] = {**cached, "cached": True}
        else:
            result = {**run_cell("steps", cell, _spec(cfg, cell), folder), "key": keys[cell.name]}
            if result["status"] == "ok":
                atomic_write_json(folder / f"{cell.name}.json", result)
            results[cell.name] = {**result, "cached": False}
    return results


def _cached(path: Path, key: str) -> dict | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if result.get("key") == key else None


def measure_allreduce(cfg: SpeedupConfig, cells: list[Cell], results: dict[str, dict], folder: Path,
                      code: str, hardware: dict[str, str]) -> dict | None:
    """The all-reduce microbenchmark at the largest measured ddp world size, with the model's
    gradient size; cached like a cell."""
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
    result = run_cell("allreduce", cell, {**_spec(cfg, cell), "grad_bytes": grad_bytes}, folder)
    if result["status"] != "ok":
        log.warning("all-reduce benchmark failed: %s", result["reason"])
        return None
    result["key"] = key
    atomic_write_json(path, result)
    return result


def hardware() -> dict[str, str]:
    env = provenance.environment()
    return {k: env[k] for k in ("env.host", "env.cpu", "env.cpu_cores", "env.torch") if k in env} | (
        {"env.gpus": env["env.gpus"]} if "env.gpus" in env else {})


def run(params: Params, out_dir: str | Path) -> dict[str, Any]:
    """Plans, measures (reusing cached cells), models and reports the study."""
    from scalelab import study_report

    cfg, out = params.speedup, Path(out_dir)
    folder = out / "cells"
    folder.mkdir(parents=True, exist_ok=True)
    cells = plan(cfg, cuda_device_count(), cpu_count())
    code, hw = code_hash(), hardware()
    keys = {c.name: cell_key(cfg, c, code, hw) for c in cells}
    results = run_pending(cfg, cells, folder, keys)
    comm = measure_allreduce(cfg, cells, results, folder, code, hw)
    return study_report.write(params, cells, results, comm, hw, out)
