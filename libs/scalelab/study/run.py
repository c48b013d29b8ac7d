"""The speedup study: plan the cells, run those not cached, model communication, report.

    scalelab speedup --params params.yaml --out results/speedup

Each cell's result is cached in `<cells>/<name>-<key>.json`, where the key hashes the cell, the
measurement params, the code of every folder the DVC stage `speedup` depends on, and the hardware:
changing one cell reruns that cell only, and results of other code or params stay beside it. The
cache (`cells_dir`) lives in the main repository, not in `--out`: a DVC experiment run in a
temporary copy (`dvc exp run --queue`, `--temp`) finds the cells its baseline measured and
measures none again unless its own `speedup.*`, code or hardware differ. Here, the cells not
cached are measured together in rounds (`run_interleaved`, study.busy): their ranks start once and
stay warm, and one timed repeat of every cell is taken per round, one cell at a time, so that load
which comes and goes touches every cell alike; busy repeats are retried or dropped. On SLURM each
cell is one job that takes all its repeats (busy ones retried the same way), the jobs one after
another. One study at a time measures into a cache (timings must not overlap).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scalelab.config import Params, strategies, to_dict
from scalelab.launch import slurm, warm
from scalelab.launch.local import LaunchError, run_ranks
from scalelab.launch.shape import Capacity, local_capacity
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.lock import FolderLock
from scalelab.runtime.paths import stage_code_digest, store_root
from scalelab.study import busy, report
from scalelab.study.cell import CellJob, summarize
from scalelab.study.plan import Cell, cell_key, plan
from scalelab.tracking import provenance

log = logging.getLogger(__name__)


def _spec(params: Params, cell: Cell) -> dict[str, Any]:
    return {**asdict(cell), "config": to_dict(params.speedup)}


def run_cell(kind: str, cell: Cell, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Runs one cell (or the all-reduce benchmark) in fresh processes; returns its result."""
    stem = f"{cell.name}.{kind}" if kind == "allreduce" else cell.name
    log.info("measuring %s", stem)
    try:
        result = run_ranks(
            ["cell-worker", kind],
            spec,
            folder,
            stem,
            nproc=_nproc(cell),
            threads_per_process=cell.threads_per_process,
        )
    except LaunchError as exc:
        return {"status": "failed", "reason": str(exc)[:500]}
    return {"status": "ok", **result}


def run_interleaved(params: Params, cells: list[Cell], folder: Path) -> list[dict[str, Any]]:
    """Measures `cells` here, their repeats in rounds (study.busy): every cell's ranks start once
    and stay warm between rounds (launch.warm); warm-ups and repeats run one cell at a time. At
    most `speedup.max_warm_cells` cells are alive at once (each rank holds torch in memory): more
    are measured in waves of that many. Returns one result per cell, in order."""
    size = params.speedup.max_warm_cells
    return [r for i in range(0, len(cells), size) for r in _interleave(params, cells[i : i + size], folder)]


def _interleave(params: Params, cells: list[Cell], folder: Path) -> list[dict[str, Any]]:
    failed: dict[str, str] = {}
    with warm.Coordinator.open() as coord:

        def turn(name: str, do: str = "repeat") -> dict[str, Any] | None:
            try:
                return coord.command(name, {"do": do})
            except warm.GroupFailed as exc:
                failed[name] = str(exc)
                return None

        for c in cells:
            log.info("measuring %s", c.name)
            coord.start(
                c.name,
                ["cell-worker", "warm"],
                _spec(params, c),
                folder,
                nproc=_nproc(c),
                threads_per_process=c.threads_per_process,
            )
        failed.update(coord.wait_connected())
        for c in cells:  # one warm-up at a time: its first step is timed (compile cost)
            if c.name not in failed:
                turn(c.name, "warmup")
        tallies = busy.take_rounds(
            [c.name for c in cells if c.name not in failed], turn, busy.Policy.of(params.speedup)
        )
        results = {}
        for c in cells:
            try:
                figures = coord.finish(c.name) if c.name not in failed else None
            except warm.GroupFailed as exc:
                failed[c.name] = str(exc)
            if c.name in failed:
                results[c.name] = {"status": "failed", "reason": failed[c.name][:500]}
            else:
                results[c.name] = summarize(figures, tallies[c.name])
    return [results[c.name] for c in cells]


def _nproc(cell: Cell) -> int | None:
    """Ranks under torchrun for a distributed strategy; None: one plain process."""
    return cell.world_size if strategies.get(cell.strategy).distributed else None


def run_slurm_cells(params: Params, items: list[tuple[str, Cell, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Submits every cell at once; `--dependency=singleton` runs them one at a time, so that no
    two cells' timings overlap. Returns one result per item, in order."""
    profile = slurm.load_profile(params.slurm.profile)
    jobs = []
    for kind, cell, spec in items:
        gpus = cell.devices_per_node if cell.device == "cuda" else 0
        ex = slurm.executor(
            params,
            profile,
            "scalelab-speedup",
            nodes=cell.nodes,
            tasks_per_node=cell.procs_per_node,
            cpus_per_task=cell.threads_per_process,
            gpus_per_node=gpus,
        )
        ex.update_parameters(slurm_additional_parameters={"dependency": "singleton"})
        jobs.append(slurm.submit(ex, CellJob(kind, spec)))
    if jobs:
        print(f"submitted {len(jobs)} study cells as SLURM jobs {', '.join(j.job_id for j in jobs)}", flush=True)
    results = []
    for job in jobs:
        try:
            results.append({"status": "ok", **slurm.wait(job, params.slurm.poll_interval_s)})
        except Exception:
            results.append({"status": "failed", "reason": slurm.error_line(job)})
    return results


def measure(params: Params, items: list[tuple[str, Cell, dict[str, Any]]], folder: Path) -> list[dict[str, Any]]:
    """Runs (kind, cell, spec) items: submitted together to SLURM (each cell's repeats in one job),
    or here: steps cells interleaved in rounds (`run_interleaved`), the all-reduce benchmark alone."""
    if params.speedup.launcher == "slurm":
        return run_slurm_cells(params, items)
    steps = [cell for kind, cell, _ in items if kind == "steps"]
    interleaved = dict(zip([c.name for c in steps], run_interleaved(params, steps, folder) if steps else []))
    return [
        interleaved[cell.name] if kind == "steps" else run_cell(kind, cell, spec, folder) for kind, cell, spec in items
    ]


def run_pending(params: Params, cells: list[Cell], folder: Path, keys: dict[str, str]) -> dict[str, dict]:
    """Measures every runnable cell whose cached result is missing or stale."""
    results: dict[str, dict] = {}
    pending = []
    for cell in cells:
        cached = _cached(cached_path(folder, cell.name, keys[cell.name]), keys[cell.name])
        if cell.skipped:
            results[cell.name] = {"status": "skipped", "reason": cell.reason}
        elif cached:
            results[cell.name] = {**cached, "cached": True}
        else:
            pending.append(cell)
    measured = measure(params, [("steps", c, _spec(params, c)) for c in pending], folder)
    for cell, result in zip(pending, measured, strict=True):
        result = {**result, "key": keys[cell.name]}
        if result["status"] == "ok":
            atomic_write_json(cached_path(folder, cell.name, keys[cell.name]), result)
        results[cell.name] = {**result, "cached": False}
    return {c.name: results[c.name] for c in cells}


def cached_path(folder: Path, name: str, key: str) -> Path:
    """Where the result of cell `name` under `key` is kept."""
    return folder / f"{name}-{key}.json"


def _cached(path: Path, key: str) -> dict | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if result.get("key") == key else None


def measure_allreduce(
    params: Params, cells: list[Cell], results: dict[str, dict], folder: Path, code: str, hardware: dict[str, str]
) -> dict | None:
    """The all-reduce microbenchmark at the largest measured ddp world size, with the model's
    gradient size; cached like a cell."""
    ddp = [
        c
        for c in cells
        if strategies.get(c.strategy).reference and results[c.name]["status"] == "ok" and c.world_size > 1
    ]
    if not ddp:
        return None
    cell = max(ddp, key=lambda c: c.world_size)
    key = cell_key(params.speedup, cell, code + "allreduce", hardware)
    path = cached_path(folder, f"{cell.name}.allreduce", key)
    cached = _cached(path, key)
    if cached:
        return cached
    spec = {**_spec(params, cell), "grad_bytes": results[cell.name]["grad_bytes"]}
    result = measure(params, [("allreduce", cell, spec)], folder)[0]
    if result["status"] != "ok":
        log.warning("all-reduce benchmark failed: %s", result["reason"])
        return None
    result["key"] = key
    atomic_write_json(path, result)
    return result


def where(params: Params) -> tuple[Capacity, dict[str, str]]:
    """What the cells may use and run on: this machine, or the SLURM profile's nodes."""
    if params.speedup.launcher == "slurm":
        profile = slurm.load_profile(params.slurm.profile)
        return slurm.capacity(profile, params.slurm.profile), {
            "slurm.profile": params.slurm.profile,
            "slurm.partition": profile.partition,
            "env.cpu_cores": str(profile.cpus_per_node),
            "env.gpus_per_node": str(profile.gpus_per_node),
        }
    env = provenance.environment()
    hw = {k: env[k] for k in ("env.host", "env.cpu", "env.cpu_cores", "env.torch", "env.gpus") if k in env}
    return local_capacity(), hw


def cells_cache() -> Path:
    """The default cell cache: `results/speedup/cells` of the main repository."""
    return store_root() / "results" / "speedup" / "cells"


def run(params: Params, out_dir: str | Path, cells_dir: str | Path | None = None) -> dict[str, Any]:
    """Plans, measures (reusing cached cells from `cells_dir`, default `cells_cache()`), models
    and reports the study."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(cells_dir) if cells_dir is not None else cells_cache()
    cap, hw = where(params)
    cells = plan(params.speedup, cap)
    code = stage_code_digest("speedup")
    keys = {c.name: cell_key(params.speedup, c, code, hw) for c in cells}
    with FolderLock(folder, wait=True):  # another study measuring here: wait, then reuse its cells
        results = run_pending(params, cells, folder, keys)
        comm = measure_allreduce(params, cells, results, folder, code, hw)
        head = report.write(params, cells, results, comm, hw, out)
        if head["invalid_cells"]:  # measured on a busy machine: none of these cells is kept for a rerun
            for cell in cells:
                cached_path(folder, cell.name, keys[cell.name]).unlink(missing_ok=True)
    return head
