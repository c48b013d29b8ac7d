"""How scalelab's costs grow with the work: a log-log slope per cost, and whether it is linear or
worse. Measured here: the whole study against its cells and `scalelab reproduce` against the run's
length; the other curves come from the files of the benchmarks that own them (run this one last).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import harness, pipeline
from scalelab.bench.harness import Goal, opt
from scalelab.config import DataConfig, build
from scalelab.data.prepare import prepare
from scalelab.runtime.paths import PACKAGE_ROOT
from scalelab.training.plan import RESOLVED_FILE, RUN_FILE

METHOD = """\
Each cost, at sizes a decade apart: least squares of log(cost) on log(size), slope 1 linear;
growth "sub-linear" (< 0.9), "linear" (0.9-1.1) or "worse than linear" (> 1.1, the goal's
failure); `local_slopes` decade by decade. From the files in the same folder (missing: "not
measured"): the tracker's in-thread CPU and store time against metrics per step
(tracking_overhead.json), `prepare` time and peak memory of a CSV against its rows (data.json),
the full-state save and load at one rank against parameters (checkpoint.json). Measured here, once
per size: `study`, a whole `scalelab speedup` in a fresh process and folder, N cells of one tiny
ddp-w1 setup at batch sizes 64, 65, ... (`per_cell_s`); `reproduce`, tracked `scalelab train` runs
of each `--run-steps` length in a committed copy of the repository, then `scalelab reproduce RUN_ID
--yes` of each (`train_s`: the run's own time; `fixed_s`: reproduce less it).
"""
PLOT_FILE = "scaling.png"
LINEAR_BAND = (0.9, 1.1)
GOAL = Goal("<=", LINEAR_BAND[1], "linear or better (slope <= 1.1)")


def fit(sizes: list[float], costs: list[float]) -> dict[str, Any]:
    """Least-squares slope of log(cost) on log(size), and its verdict."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(c, 1e-12)) for c in costs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    growth = "sub-linear" if slope < LINEAR_BAND[0] else "linear" if slope <= LINEAR_BAND[1] else "worse than linear"
    local = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]  # decade by decade
    fitted = {"sizes": sizes, "costs": costs, "slope": slope, "local_slopes": local, "growth": growth}
    return fitted | {"linear_or_better": slope <= LINEAR_BAND[1]}


UNITS = {
    "tracking_in_thread_vs_metrics_per_step": ("metrics per step", "us per step (in thread)"),
    "tracking_store_vs_metrics_per_step": ("metrics per step", "s per step (writer, stored)"),
    "prepare_time_vs_csv_rows": ("CSV rows", "s"),
    "prepare_peak_memory_vs_csv_rows": ("CSV rows", "MB above the import baseline"),
    "checkpoint_save_vs_parameters": ("parameters", "s"),
    "checkpoint_load_vs_parameters": ("parameters", "s"),
    "study_wall_vs_cells": ("cells", "s"),
    "reproduce_vs_run_length": ("training steps", "s"),
}


def plot(curves: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(2, 4, figsize=(17, 7))
    for ax, (name, curve) in zip(axes.flat, curves.items()):
        ax.loglog(curve["sizes"], curve["costs"], "o-", label=name.split("_vs_")[0])
        if "train_s" in curve:  # reproduce: its run's own training time beside it
            ax.loglog(curve["sizes"], curve["train_s"], "s--", label="its run's training")
            ax.legend(fontsize=7)
        if max(curve["sizes"]) < 100 * min(curve["sizes"]):  # under two decades (cells): label each size
            ax.set_xticks(curve["sizes"], [f"{s:g}" for s in curve["sizes"]])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{name.replace('_vs_', ' vs ')}\nslope {curve['slope']:.2f} ({curve['growth']})", fontsize=9)
        ax.set_xlabel(UNITS[name][0])
        ax.set_ylabel(UNITS[name][1])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


STUDY_BATCH = 64  # cell i runs batch STUDY_BATCH + i: nearly equal work, a distinct cell each
STUDY = {  # one setup (ddp-w1) on any machine: `single` adds a setup per thread count
    "workload": "mlp", "model": {"hidden": [64], "dropout": 0.0}, "num_features": 32, "strategies": ["ddp"],
    "world_sizes": [1], "precisions": ["fp32"], "compile": [False], "device": "cpu", "warmup_steps": 1,
    "timed_steps": 2, "repeats": 2,
}  # fmt: skip
STEPS_PER_EPOCH = 10
# 457 synthetic samples split 320 / 46 / 91 (train / val / test): 10 steps of 32 per epoch
RUN_DATA = {"source": "synthetic", "synthetic": {"num_samples": 457, "num_features": 32}}
RUN_TRAIN = {
    "strategy": "single", "nproc_per_node": 1, "threads_per_process": 1, "device": "cpu", "batch_size": 32,
    "model": {"hidden": [32], "dropout": 0.0}, "untimed_steps": 2,
}  # fmt: skip


def _base_params(root: Path) -> dict[str, Any]:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tracking"].update(experiment="bench-scaling", enabled=True, system_metrics_interval_s=0.0)
    return params


def study_params(cells: int) -> dict[str, Any]:
    """params.yaml for a study of `cells` cells: STUDY at batch sizes STUDY_BATCH, +1, ..."""
    params = _base_params(PACKAGE_ROOT)
    params["speedup"].update(STUDY, batch_sizes=[STUDY_BATCH + i for i in range(cells)])
    return params


def study_costs(cells: list[int], work: Path) -> dict[str, list[float]]:
    """Wall time of a whole `scalelab speedup` with N cells, each study in a fresh folder."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    wall, per_cell = [], []
    for n in cells:
        folder = work / f"study-{n}"
        folder.mkdir()
        pipeline.write_params(folder / "params.yaml", study_params(n))  # a repository of its own
        args = ["speedup", "--params", "params.yaml", "--out", "out", "--cells", "cells"]  # a fresh cell cache
        start = time.perf_counter()
        proc = pipeline.scalelab(*args, cwd=folder, env=env)
        wall_s = time.perf_counter() - start
        measured = proc.stderr.count("measuring ")
        if measured != n:
            raise RuntimeError(f"the {n}-cell study measured {measured} cells: {proc.stderr[-1500:]}")
        wall.append(wall_s)
        per_cell.append(wall_s / n)
    return {"wall_s": wall, "per_cell_s": per_cell}


def reproduce_costs(run_steps: list[int], work: Path) -> dict[str, list[float]]:
    """Tracked runs of each length in a committed copy of the repository, then `scalelab reproduce`
    of each: both wall times and the steps each run planned."""
    bad = [s for s in run_steps if s % STEPS_PER_EPOCH]
    if bad:
        raise ValueError(f"--run-steps {bad}: each must be a multiple of {STEPS_PER_EPOCH} (steps per epoch)")
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-bench-scaling-"))  # outside any checkout
    try:
        return _reproduce_costs(run_steps, pipeline.committed_copy(PACKAGE_ROOT, tmp / "repo"), work)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _reproduce_costs(run_steps: list[int], repo: Path, work: Path) -> dict[str, list[float]]:
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "PYTHONPATH": os.pathsep.join([str(repo / "libs"), str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    base = _base_params(repo)
    base["data"].update(RUN_DATA)
    prepare(build(DataConfig, base["data"]), repo / "data/prepared")  # not timed; ignored by git
    train_s, reproduce_s, steps, matched = [], [], [], []
    for n in run_steps:
        params = {**base, "train": {**base["train"], **RUN_TRAIN, "epochs": n // STEPS_PER_EPOCH}}
        path = repo / "results" / f"params-{n}.yaml"  # in the copy (its repository), ignored by git: a clean tree
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(params, sort_keys=False))
        out = repo / f"results/train-{n}"
        args = ["train", "--params", str(path), "--data", "data/prepared", "--out", str(out.relative_to(repo))]
        start = time.perf_counter()
        pipeline.scalelab(*args, cwd=repo, env=env)
        train_s.append(time.perf_counter() - start)
        steps.append(json.loads((out / RESOLVED_FILE).read_text())["plan"]["total_steps"])
        run_id = json.loads((out / RUN_FILE).read_text())["run_id"]
        start = time.perf_counter()
        proc = pipeline.scalelab("reproduce", run_id, "--yes", cwd=repo, env=env, ok=(0, 1))  # 1: a figure differed
        reproduce_s.append(time.perf_counter() - start)
        matched.append(proc.returncode == 0)
    return {"reproduce_s": reproduce_s, "train_s": train_s, "steps": steps, "matched": matched}


def from_files(out: Path) -> dict[str, Any]:
    """The curves other benchmarks measured, from their JSON files in `out` (None: not there)."""
    read = lambda name: json.loads((out / name).read_text()) if (out / name).is_file() else {}  # noqa: E731
    curves: dict[str, Any] = {}
    track = read("tracking_overhead.json").get("metrics_per_step")
    if track:
        curves["tracking_in_thread_vs_metrics_per_step"] = fit(track["metrics"], track["in_thread_us_per_step"])
        curves["tracking_store_vs_metrics_per_step"] = fit(track["metrics"], track["store_s_per_step"])
    rows = read("data.json").get("csv_rows")
    if rows:
        curves["prepare_time_vs_csv_rows"] = fit(rows["rows"], rows["prepare_s"])
        peak = fit(rows["rows"], rows["prepare_peak_above_start_mb"])
        curves["prepare_peak_memory_vs_csv_rows"] = {**peak, "peak_rss_mb": rows["prepare_peak_mb"]}
    from scalelab.bench.checkpoint import ARMS

    rows = read("checkpoint.json").get("rows", [])  # ddp's full state at one rank
    full = sorted((r["parameters"], r) for r in rows if r["strategy"] == ARMS[0] and r["world_size"] == 1)
    if len(full) > 1:
        curves["checkpoint_save_vs_parameters"] = fit([p for p, _ in full], [r["save_s"] for _, r in full])
        curves["checkpoint_load_vs_parameters"] = fit([p for p, _ in full], [r["load_s"] for _, r in full])
    return curves


SOURCES = {"tracking": "tracking", "prepare": "data", "checkpoint": "checkpoint"}


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    curves = from_files(ctx.out)
    study = study_costs(args.cells, ctx.work)
    rep = reproduce_costs(args.run_steps, ctx.work)
    fixed = [r - t for r, t in zip(rep["reproduce_s"], rep["train_s"])]
    curves["study_wall_vs_cells"] = {**fit(args.cells, study["wall_s"]), "per_cell_s": study["per_cell_s"]}
    curves["reproduce_vs_run_length"] = {
        **fit(rep["steps"], rep["reproduce_s"]), "train_s": rep["train_s"], "fixed_s": fixed,
        "train_slope": fit(rep["steps"], rep["train_s"])["slope"], "matched": rep["matched"],
        "note": f"reproduce {rep['reproduce_s'][-1]:.1f} s = training {rep['train_s'][-1]:.1f} s "
        f"+ {fixed[-1]:.1f} s at {rep['steps'][-1]} steps",
    }  # fmt: skip
    curves = {name: curves[name] for name in UNITS if name in curves}
    plot(curves, ctx.out / PLOT_FILE)
    not_measured = {}
    for name in UNITS:
        curve = curves.get(name)
        if curve is None:
            source = SOURCES[name.split("_")[0]]
            not_measured[name] = f"not measured: run `scalelab bench {source}` into this folder first"
            ctx.figure(f"scaling_{name}", not_measured[name], None, GOAL)
            continue
        sizes = curve["sizes"]
        text = f"log-log slope {curve['slope']:.2f} ({curve['growth']}) over {sizes[0]:g}..{sizes[-1]:g}"
        ctx.figure(f"scaling_{name}", text + (f"; {curve['note']}" if "note" in curve else ""), curve["slope"], GOAL)
    result = {"linear_band": list(LINEAR_BAND), "curves": curves, "plot": PLOT_FILE}
    result["units"] = {k: {"size": v[0], "cost": v[1]} for k, v in UNITS.items()}
    return result | ({"not_measured": not_measured} if not_measured else {})


OPTIONS = (
    opt("--cells", [1, 2, 4, 8], "study sizes (cells)"),
    opt("--run-steps", [10, 100, 1000], "reproduce: training steps (x10)"),
)
BENCH = harness.Benchmark("scaling", "scaling.json", METHOD, measure, OPTIONS)
