"""How scalelab's costs grow with the work: a log-log slope per cost, and whether it is linear or worse. Measured
here: the whole study against its cells and `scalelab reproduce` against the run's length; the other curves come from
the files of the benchmarks that own them (run this one last)."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import harness, pipeline
from scalelab.bench.harness import Goal, opt, timed
from scalelab.runtime.paths import PACKAGE_ROOT
from scalelab.training.plan import RESOLVED_FILE, RUN_FILE

METHOD = """\
Per cost, at sizes a decade apart: the least-squares slope of log(cost) on log(size) (1: linear), growth "sub-linear"
(< 0.9), "linear" or "worse than linear" (> 1.1: the goal fails), `local_slopes` decade by decade. From the other
benchmarks' files in this folder (missing: "not measured"): tracking_overhead.json (the tracker's in-thread CPU and
store time against metrics per step), data.json (`prepare` time and peak memory against CSV rows), checkpoint.json
(full-state save and load at one rank against parameters). Measured here, once per size (a busy one retried, then
dropped): a whole `scalelab speedup` of N cells (one tiny ddp-w1 setup at batch 64, 65, ...) in a fresh process and
folder; a tracked `scalelab train` of each `--run-steps` length in a committed copy of the repository, then `scalelab
reproduce RUN_ID --yes` (`fixed_s`: reproduce less `train_s`).
"""
PLOT_FILE = "scaling.png"
LINEAR_BAND = (0.9, 1.1)
GOAL = Goal("<=", LINEAR_BAND[1], "linear or better (slope <= 1.1)")
UNITS = {  # curve -> (the benchmark that measures it, size, cost)
    "tracking_in_thread_vs_metrics_per_step": ("tracking", "metrics per step", "us per step (in thread)"),
    "tracking_store_vs_metrics_per_step": ("tracking", "metrics per step", "s per step (writer, stored)"),
    "prepare_time_vs_csv_rows": ("data", "CSV rows", "s"),
    "prepare_peak_memory_vs_csv_rows": ("data", "CSV rows", "MB above the import baseline"),
    "checkpoint_save_vs_parameters": ("checkpoint", "parameters", "s"),
    "checkpoint_load_vs_parameters": ("checkpoint", "parameters", "s"),
    "study_wall_vs_cells": ("scaling", "cells", "s"),
    "reproduce_vs_run_length": ("scaling", "training steps", "s"),
}
STUDY = {  # one setup (ddp-w1) on any machine; cell i runs batch 64 + i: nearly equal work, a distinct cell each
    "workload": "mlp", "model": {"hidden": [64], "dropout": 0.0}, "num_features": 32, "strategies": ["ddp"],
    "world_sizes": [1], "precisions": ["fp32"], "compile": [False], "device": "cpu", "warmup_steps": 1,
    "timed_steps": 2, "repeats": 2, "max_others_cpu_share": 1.0,  # busy: the harness retries the whole study
}  # fmt: skip
TRACKING = {"experiment": "bench-scaling", "enabled": True, "system_metrics_interval_s": 0.0}
STEPS_PER_EPOCH = 10  # of RUN_DATA's 457 synthetic samples, 320 train (46 val, 91 test): 10 steps of 32
RUN_DATA = {"source": "synthetic", "synthetic": {"num_samples": 457, "num_features": 32}}
RUN_TRAIN = {
    "strategy": "single", "nproc_per_node": 1, "threads_per_process": 1, "device": "cpu", "batch_size": 32,
    "model": {"hidden": [32], "dropout": 0.0}, "untimed_steps": 2,
}  # fmt: skip


def fit(sizes: list[float], costs: list[float]) -> dict[str, Any]:
    """Least-squares slope of log(cost) on log(size), its slopes decade by decade, and its growth."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(c, 1e-12)) for c in costs]
    slope = statistics.linear_regression(xs, ys).slope
    growth = "sub-linear" if slope < LINEAR_BAND[0] else "linear" if slope <= LINEAR_BAND[1] else "worse than linear"
    local = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    return {"sizes": sizes, "costs": costs, "slope": slope, "local_slopes": local, "growth": growth}


def plot(curves: dict[str, Any], path: Path) -> None:
    """One log-log panel per curve; reproduce's shows its run's own training beside it."""
    from scalelab.study.plots import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(17, 7))
    for ax, (name, curve) in zip(axes.flat, curves.items()):
        ax.loglog(curve["sizes"], curve["costs"], "o-", label=name.split("_vs_")[0])
        if "train_s" in curve:
            ax.loglog(curve["sizes"], curve["train_s"], "s--", label="its run's training")
            ax.legend(fontsize=7)
        if max(curve["sizes"]) < 100 * min(curve["sizes"]):  # under two decades (cells): label each size
            ax.set_xticks(curve["sizes"], [f"{s:g}" for s in curve["sizes"]], minor=False)
            ax.set_xticks([], minor=True)
        ax.set_title(f"{name.replace('_vs_', ' vs ')}\nslope {curve['slope']:.2f} ({curve['growth']})", fontsize=9)
        ax.set(xlabel=UNITS[name][1], ylabel=UNITS[name][2])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def study_params(cells: int) -> dict[str, Any]:
    """params.yaml for a study of `cells` cells: STUDY at batch sizes 64, 65, ..."""
    params = yaml.safe_load((PACKAGE_ROOT / "params.yaml").read_text())
    params["tracking"].update(TRACKING)
    params["speedup"].update(STUDY, batch_sizes=[64 + i for i in range(cells)])
    return params


def per_size(take: Callable[[int, int], Any], sizes: list[int], policy: dict[str, Any]) -> tuple[list, list]:
    """`take(size, try)` kept once per size (a busy try retried, then dropped): the values and the drops."""
    reps = [harness.take_repeats(partial(take, n), policy) for n in sizes]
    return [r.kept[0] for r in reps], [d for r in reps for d in r.dropped]


def study_costs(cells: list[int], work: Path, policy: dict[str, Any]) -> dict[str, list]:
    """Wall time of a whole `scalelab speedup` with N cells, each study in a fresh folder."""
    env = pipeline.store_env(work, tracking=False)

    def take(n: int, i: int) -> float:  # try i of N cells
        folder = work / f"study-{n}-{i}"
        folder.mkdir()
        pipeline.write_params(folder / "params.yaml", study_params(n))  # a repository of its own
        start = time.perf_counter()
        proc = pipeline.scalelab("speedup", "--out", "out", "--cells", "cells", cwd=folder, env=env)  # a fresh cache
        wall_s, measured = time.perf_counter() - start, proc.stderr.count("measuring ")
        if measured != n:
            raise RuntimeError(f"the {n}-cell study measured {measured} cells: {proc.stderr[-1500:]}")
        return wall_s

    wall, dropped = per_size(take, cells, policy)
    return {"wall_s": wall, "per_cell_s": [w / n for w, n in zip(wall, cells)], "dropped": dropped}


def reproduce_costs(run_steps: list[int], work: Path, policy: dict[str, Any]) -> dict[str, list]:
    """Tracked runs of each length in a committed copy of the repository (in `work`, outside any checkout), then
    `scalelab reproduce` of each: both wall times, the steps each run planned and whether reproduce matched."""
    if bad := [s for s in run_steps if s % STEPS_PER_EPOCH]:
        raise ValueError(f"--run-steps {bad}: each must be a multiple of {STEPS_PER_EPOCH} (steps per epoch)")
    repo = pipeline.committed_copy(PACKAGE_ROOT, work / "repo")
    paths = [str(repo / "libs"), str(repo), os.environ.get("PYTHONPATH", "")]
    env = pipeline.store_env(work, tracking=False) | {"PYTHONPATH": os.pathsep.join(paths)}
    base = yaml.safe_load((repo / "params.yaml").read_text())
    base["tracking"].update(TRACKING)
    base["data"].update(RUN_DATA)
    base["train"].update(RUN_TRAIN)
    pipeline.prepare_data(base, repo / "data/prepared")  # not timed; ignored by git
    (repo / "results").mkdir(exist_ok=True)  # ignored by git: the tree stays clean

    def take(n: int, i: int) -> dict[str, Any]:  # try i of an n-step run
        params = {**base, "train": {**base["train"], "epochs": n // STEPS_PER_EPOCH}}
        path, out = pipeline.write_params(repo / f"results/params-{n}-{i}.yaml", params), f"results/train-{n}-{i}"
        cmd = ["train", "--params", str(path), "--data", "data/prepared", "--out", out]
        train_s = timed(pipeline.scalelab, *cmd, cwd=repo, env=env)
        steps = json.loads((repo / out / RESOLVED_FILE).read_text())["plan"]["total_steps"]
        run_id = json.loads((repo / out / RUN_FILE).read_text())["run_id"]
        start = time.perf_counter()
        proc = pipeline.scalelab("reproduce", run_id, "--yes", cwd=repo, env=env, ok=(0, 1))  # 1: a figure differed
        reproduce_s = time.perf_counter() - start
        return {"reproduce_s": reproduce_s, "train_s": train_s, "steps": steps, "matched": proc.returncode == 0}

    got, dropped = per_size(take, run_steps, policy)
    return {key: [g[key] for g in got] for key in got[0]} | {"dropped": dropped}


def from_files(out: Path) -> dict[str, Any]:
    """The curves other benchmarks measured, from their JSON files in `out` (absent: not there)."""
    from scalelab.bench.checkpoint import ARMS

    read = lambda name: json.loads((out / name).read_text()) if (out / name).is_file() else {}  # noqa: E731
    curves: dict[str, Any] = {}
    if track := read("tracking_overhead.json").get("metrics_per_step"):
        curves["tracking_in_thread_vs_metrics_per_step"] = fit(track["metrics"], track["in_thread_us_per_step"])
        curves["tracking_store_vs_metrics_per_step"] = fit(track["metrics"], track["store_s_per_step"])
    if rows := read("data.json").get("csv_rows"):
        curves["prepare_time_vs_csv_rows"] = fit(rows["rows"], rows["prepare_s"])
        peak = fit(rows["rows"], rows["prepare_peak_above_start_mb"])
        curves["prepare_peak_memory_vs_csv_rows"] = {**peak, "peak_rss_mb": rows["prepare_peak_mb"]}
    rows = read("checkpoint.json").get("rows", [])  # ddp's full state at one rank
    full = sorted((r["parameters"], r) for r in rows if r["strategy"] == ARMS[0] and r["world_size"] == 1)
    for cost in ("save", "load") if len(full) > 1 else ():
        curves[f"checkpoint_{cost}_vs_parameters"] = fit([p for p, _ in full], [r[f"{cost}_s"] for _, r in full])
    return curves


def study_curve(args: Any, work: Path, policy: dict[str, Any]) -> dict[str, Any]:
    study = study_costs(args.cells, work, policy)
    return {**fit(args.cells, study.pop("wall_s")), **study}


def reproduce_curve(args: Any, work: Path, policy: dict[str, Any]) -> dict[str, Any]:
    rep = reproduce_costs(args.run_steps, work, policy)
    steps, reproduce_s, train_s = rep.pop("steps"), rep.pop("reproduce_s"), rep["train_s"]
    fixed = [r - t for r, t in zip(reproduce_s, train_s)]
    note = f"reproduce {reproduce_s[-1]:.1f} s = training {train_s[-1]:.1f} s + {fixed[-1]:.1f} s at {steps[-1]} steps"
    own = {"fixed_s": fixed, "train_slope": fit(steps, train_s)["slope"], "note": note}
    return {**fit(steps, reproduce_s), **rep, **own}


def measure(ctx: harness.Context) -> dict[str, Any]:
    curves, busy = from_files(ctx.out), {}
    for name, curve in (("study_wall_vs_cells", study_curve), ("reproduce_vs_run_length", reproduce_curve)):
        try:
            curves[name] = curve(ctx.args, ctx.work, ctx.policy(1))
        except harness.MachineBusy as exc:  # no figure for this curve; the others are still written
            busy[name] = f"not measured: {exc}"
    curves = {name: curves[name] for name in UNITS if name in curves}
    plot(curves, ctx.out / PLOT_FILE)
    for name, (source, _, _) in UNITS.items():
        if (curve := curves.get(name)) is None:
            text = busy.get(name, f"not measured: run `scalelab bench {source}` into this folder first")
            ctx.figure(f"scaling_{name}", text, None, GOAL)
            continue
        (low, *_, high), slope = curve["sizes"], curve["slope"]
        text = f"log-log slope {slope:.2f} ({curve['growth']}) over {low:g}..{high:g}"
        text += f"; {curve['note']}" if "note" in curve else ""
        ctx.figure(f"scaling_{name}", text, slope, GOAL, dropped=curve.get("dropped"))
    units = {name: {"size": size, "cost": cost} for name, (_, size, cost) in UNITS.items()}
    return {"linear_band": list(LINEAR_BAND), "curves": curves, "plot": PLOT_FILE, "units": units}


OPTIONS = (
    opt("--cells", [1, 2, 4, 8], "study sizes (cells)"),
    opt("--run-steps", [10, 100, 1000], "reproduce: training steps (x10)"),
)
BENCH = harness.Benchmark("scaling", "scaling.json", METHOD, measure, OPTIONS, scratch_outside=True)
