"""How scalelab's costs grow with the work: a log-log slope per cost, and whether it is linear or worse.

    scalelab bench scaling --out results/bench                 # -> scaling.json, scaling.png
    scalelab bench scaling --max-rows 1000000 --max-params 100000000   # the issue's full ranges
    scalelab bench scaling --cells 1 2 4 8 16 --run-steps 10 100 1000 10000   # longer study, reproduce

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scalelab import tracking
from scalelab.bench import scaling_runs, stats
from scalelab.runtime.io import atomic_write_json
from scalelab.training.checkpoint import Checkpointer

METHOD = """\
Each cost is timed at sizes a decade apart and fitted with least squares on log(cost) against
log(size): slope 1 is linear growth. Growth is "sub-linear" (slope < 0.9, fixed costs still
dominate), "linear" (0.9-1.1) or "worse than linear" (> 1.1, the goal's failure). Each point is
the median of `--repeats` (prepare: of `--repeats` calls in one fresh process; study and
reproduce, whole commands of seconds to minutes: one run per size).
- tracking: MlflowTracker.log_metrics with N metrics per step for `--tracking-steps` steps, a
  flush(wait=False) every 10 steps; `in_thread_us_per_step` is the training thread's CPU time
  (time.thread_time_ns) in those calls; `store_s_per_step` the wall time until the writer process
  has stored them (SQLite), per step. One run and writer, started before the timing.
- prepare: scalelab.data.prepare.prepare on a CSV of R rows x 32 float features + label (source
  file), in one fresh Python process, smallest first; `peak_rss_mb` is that process's peak
  resident memory while preparing (psutil, sampled every 2 ms) and `peak_rss_above_baseline_mb`
  the same less its resident memory just before (imports and earlier sizes).
- checkpoint: Checkpointer.save and load_latest of a state holding one float32 tensor of P
  parameters plus an AdamW-like optimizer state (two more tensors of P), on the local disk
  (save: torch.save into memory, then a temp file, fsync and os.replace). `local_slopes` give the
  slope decade by decade: a save that outgrows the page cache runs at disk speed.
- study: the whole `scalelab speedup` (`python -m scalelab.cli speedup`, the command of the dvc
  stage `speedup`) as a fresh process, wall time from start to exit, once per size (smallest
  first), each into a fresh output folder (no cached cell). Only the number of cells changes: one
  setup (ddp at world size 1, so one setup on any machine; `single` adds one per thread count) and
  N nearly equal `batch_sizes` (64, 65, ..., 64+N-1), each cell a tiny MLP (64 wide, 32 features),
  1 warm-up + 2 timed steps x 2 repeats, on CPU, tracked into the SQLite store (a parent run and
  one child run per cell). `per_cell_s` is wall / cells.
- reproduce: a copy of the repository's files committed into a fresh git repository; tracked runs
  (`scalelab train`, single process, 1 thread, MLP 32 wide, batch 32, 10 steps per epoch on 457
  synthetic samples, epochs = steps / 10, system metrics off) of each length in `--run-steps`,
  then `scalelab reproduce RUN_ID --yes` of each as a fresh process, wall time from start to exit
  (it verifies the data, checks out a git worktree, retrains with the same params and compares
  every metric bitwise). `train_s` is the original run's own `scalelab train` wall time; `fixed_s`
  is reproduce less it: the fixed costs on top of retraining. Once per size, smallest first.
"""
OUT_FILE, PLOT_FILE = "scaling.json", "scaling.png"
LINEAR_BAND = (0.9, 1.1)
PREPARE_CHILD = """\
import gc, json, shutil, sys, threading, time
import numpy, pandas, psutil  # prepare imports numpy and pandas on first use: not in any size's time
from scalelab.config import DataConfig, build
from scalelab.data.prepare import prepare
repeats, out = int(sys.argv[1]), sys.argv[2]
me, peak, done = psutil.Process(), [0], threading.Event()
def sample():  # resident memory every 2 ms
    while not done.wait(0.002):
        peak[0] = max(peak[0], me.memory_info().rss)
for csv in sys.argv[3:]:
    cfg = build(DataConfig, {"source": "file", "file": {"path": csv, "label_column": "label"}})
    gc.collect()
    base, times = me.memory_info().rss, []
    peak[0] = base
    done.clear(); sampler = threading.Thread(target=sample); sampler.start()
    for _ in range(repeats):
        start = time.perf_counter(); prepare(cfg, out); times.append(time.perf_counter() - start)
    done.set(); sampler.join()
    shutil.rmtree(out)
    print(json.dumps({"times_s": times, "peak_b": peak[0], "base_b": base}), flush=True)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics", type=int, nargs="+", default=[1, 10, 100, 1000], help="metrics per step")
    parser.add_argument(
        "--tracking-steps", type=int, default=30, help="logged steps per metric count and repeat (default: 30)"
    )
    parser.add_argument(
        "--min-rows", type=int, default=1000, help="smallest data prepared, rows; x10 up to --max-rows (default: 1000)"
    )
    parser.add_argument("--max-rows", type=int, default=100_000, help="10^6: the issue's full range")
    parser.add_argument(
        "--min-params",
        type=int,
        default=100_000,
        help="smallest checkpoint, parameters; x10 up to --max-params (default: 100000)",
    )
    parser.add_argument("--max-params", type=int, default=10_000_000, help="10^8: the issue's full range")
    parser.add_argument("--cells", type=int, nargs="+", default=[1, 2, 4, 8], help="study sizes (cells)")
    parser.add_argument(
        "--run-steps", type=int, nargs="+", default=[10, 100, 1000], help="reproduce: training steps (x10)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="in-process curves (the study and reproduce: once)")


def decades(low: int, high: int) -> list[int]:
    """low, 10 low, ... up to high (inclusive)."""
    out = [low]
    while out[-1] * 10 <= high:
        out.append(out[-1] * 10)
    return out


def fit(sizes: list[float], costs: list[float]) -> dict[str, Any]:
    """Least-squares slope of log(cost) on log(size), and its verdict."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(c, 1e-12)) for c in costs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    growth = "sub-linear" if slope < LINEAR_BAND[0] else "linear" if slope <= LINEAR_BAND[1] else "worse than linear"
    local = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]  # decade by decade
    return {
        "sizes": sizes,
        "costs": costs,
        "slope": slope,
        "local_slopes": local,
        "growth": growth,
        "linear_or_better": slope <= LINEAR_BAND[1],
    }


def tracking_costs(metrics: list[int], steps: int, repeats: int, work: Path) -> dict[str, list[float]]:
    from scalelab.tracking import runs

    client = runs.client(f"sqlite:///{work / 'mlflow.db'}")
    exp = tracking.experiment_id(client, "bench-scaling")
    in_thread, store = [], []
    run_id = client.create_run(exp, run_name="scaling").info.run_id
    tracker = tracking.MlflowTracker(client, run_id, writer_after_s=0)  # the writer path, from the start
    tracker.log_metrics({"start": 0.0}, 0)
    tracker.flush(wait=False)
    tracker.flush(wait=True)  # the writer runs before the timing
    for n in metrics:
        cpu_us, store_s = [], []
        for rep in range(repeats):
            cpu_ns, start = 0, time.perf_counter()
            for step in range(1 + rep * steps, 1 + (rep + 1) * steps):
                values = {f"n{n}_m{i}": float(step + i) for i in range(n)}
                cpu = time.thread_time_ns()
                tracker.log_metrics(values, step)
                if step % 10 == 0:
                    tracker.flush(wait=False)
                cpu_ns += time.thread_time_ns() - cpu
            tracker.flush(wait=True)
            store_s.append((time.perf_counter() - start) / steps)
            cpu_us.append(cpu_ns / 1000.0 / steps)
        in_thread.append(statistics.median(cpu_us))
        store.append(statistics.median(store_s))
    tracker.finish()
    return {"in_thread_us_per_step": in_thread, "store_s_per_step": store}


def prepare_costs(rows: list[int], repeats: int, work: Path) -> dict[str, list[float]]:
    import numpy as np
    import pandas as pd

    files = []
    for n in rows:
        rng = np.random.default_rng(0)
        frame = pd.DataFrame(rng.standard_normal((n, 32)), columns=[f"f{i}" for i in range(32)])
        frame["label"] = rng.integers(0, 10, n)
        files.append(work / f"rows-{n}.csv")
        frame.to_csv(files[-1], index=False)
    cmd = [sys.executable, "-c", PREPARE_CHILD, str(repeats), str(work / "prepared"), *map(str, files)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"prepare failed: {proc.stderr[-2000:]}")
    got = [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(rows) :]]
    for csv in files:
        csv.unlink()
    return {
        "time_s": [statistics.median(g["times_s"]) for g in got],
        "peak_rss_mb": [g["peak_b"] / 2**20 for g in got],
        "peak_rss_above_baseline_mb": [max(g["peak_b"] - g["base_b"], 4096) / 2**20 for g in got],
    }


def checkpoint_costs(params: list[int], repeats: int, work: Path) -> dict[str, list[float]]:
    save, load = [], []
    for n in params:
        state = {"model": {"w": torch.randn(n)}, "optimizer": {"exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}}
        ckpt = Checkpointer(work / f"ckpt-{n}", "bench", keep=1)
        save_s, load_s = [], []
        for rep in range(repeats):
            start = time.perf_counter()
            ckpt.save(rep + 1, state)
            save_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert ckpt.load_latest() is not None
            load_s.append(time.perf_counter() - start)
        save.append(statistics.median(save_s))
        load.append(statistics.median(load_s))
        shutil.rmtree(work / f"ckpt-{n}", ignore_errors=True)
    return {"save_s": save, "load_s": load}


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rows, params = decades(args.min_rows, args.max_rows), decades(args.min_params, args.max_params)
    track = tracking_costs(args.metrics, args.tracking_steps, args.repeats, work)
    prep = prepare_costs(rows, args.repeats, work)
    ckpt = checkpoint_costs(params, args.repeats, work)
    study = scaling_runs.study_costs(args.cells, work)
    rep = scaling_runs.reproduce_costs(args.run_steps, work)
    fixed = [r - t for r, t in zip(rep["reproduce_s"], rep["train_s"])]
    return {
        "tracking_in_thread_vs_metrics_per_step": fit(args.metrics, track["in_thread_us_per_step"]),
        "tracking_store_vs_metrics_per_step": fit(args.metrics, track["store_s_per_step"]),
        "prepare_time_vs_csv_rows": fit(rows, prep["time_s"]),
        "prepare_peak_memory_vs_csv_rows": {
            **fit(rows, prep["peak_rss_above_baseline_mb"]),
            "peak_rss_mb": prep["peak_rss_mb"],
        },
        "checkpoint_save_vs_parameters": fit(params, ckpt["save_s"]),
        "checkpoint_load_vs_parameters": fit(params, ckpt["load_s"]),
        "study_wall_vs_cells": {**fit(args.cells, study["wall_s"]), "per_cell_s": study["per_cell_s"]},
        "reproduce_vs_run_length": {
            **fit(rep["steps"], rep["reproduce_s"]),
            "train_s": rep["train_s"],
            "fixed_s": fixed,
            "train_slope": fit(rep["steps"], rep["train_s"])["slope"],
            "matched": rep["matched"],
            "note": f"reproduce {rep['reproduce_s'][-1]:.1f} s = training {rep['train_s'][-1]:.1f} s "
            f"+ {fixed[-1]:.1f} s at {rep['steps'][-1]} steps",
        },
    }


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


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures, writes scaling.json, scaling.png and one summary line per curve."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bench-scaling-", dir=out_dir)).resolve()  # runs from other cwds
    try:
        curves = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plot(curves, out_dir / PLOT_FILE)
    result = {
        "benchmark": "scaling",
        "method": METHOD,
        "repeats": args.repeats,
        "linear_band": list(LINEAR_BAND),
        "curves": curves,
        "units": {k: {"size": v[0], "cost": v[1]} for k, v in UNITS.items()},
        "plot": PLOT_FILE,
    }
    atomic_write_json(out_dir / OUT_FILE, result)
    for name, curve in curves.items():
        figure = (
            f"log-log slope {curve['slope']:.2f} ({curve['growth']}) over {curve['sizes'][0]:g}..{curve['sizes'][-1]:g}"
            + (f"; {curve['note']}" if "note" in curve else "")
        )
        stats.write_summary_line(
            out_dir, f"scaling_{name}", figure, "linear or better (slope <= 1.1)", curve["linear_or_better"]
        )
    return result


def headline(result: dict, out: Path) -> str:
    slopes = ", ".join(f"{k.split('_vs_')[0]} {v['slope']:.2f}" for k, v in result["curves"].items())
    return f"scaling slopes: {slopes} -> {out / OUT_FILE}, {out / PLOT_FILE}"
