"""What `train.profile` costs a whole training run: `scalelab train` with the profiler on and off.

    scalelab bench profiler --out results/bench     # -> results/bench/profiler_overhead.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from scalelab.bench import pipeline, stats
from scalelab.config.loader import ConfigError
from scalelab.runtime.io import atomic_write_json

METHOD = """\
The pipeline's default training: `scalelab train` on params.yaml (changed only by `--set`), in a
fresh process each time, on the pipeline's prepared data (made once, in a temporary folder, from
the same params: byte for byte what `dvc repro prepare` writes), with tracking into a private
SQLite MLflow store whose schema is made before the first timed run. Two arms: `off`
(train.profile.enabled false) and `on` (true: torch.profiler over wait/warmup/active steps, the
Chrome trace and op tables written and logged as MLflow artifacts). Each repeat runs both, the
order alternating from repeat to repeat. The figure is the whole run's wall time (process start
to exit), as the median over repeats of on/off, with a percentile bootstrap 95% interval (2000
resamples of whole repeats, seed 0). For reference: `cpu_time`, the same ratio of the CPU time
(user + system) of all the run's processes (RUSAGE_CHILDREN), which other load on the machine
moves less than wall time, and `step_time_ms`, the run's own mean step time from metrics.json.
"""
OUT_FILE = "profiler_overhead.json"
TARGET_RATIO = 1.05
ARMS = ("off", "on")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="the params to train with (default: params.yaml)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="training runs per arm, profiler on and off (default: 3)"
    )
    pipeline.add_set_argument(parser)


def _train(params_path: Path, data: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    pipeline.scalelab("train", "--params", str(params_path), "--data", str(data), "--out", str(out), env=env)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process of the run, ranks included
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    metrics = json.loads((out / "metrics.json").read_text())
    traces = sorted((out / "profile").glob("trace-rank*.json.gz"))
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "step_time_ms": metrics.get("step_time_ms"),
        "steps": metrics["steps"],
        "trace_bytes": sum(p.stat().st_size for p in traces),
        "traces": len(traces),
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Prepares the data once, then runs the interleaved repeats; returns every run's figures."""
    raw = pipeline.params_tree(args.params, args.sets)
    if raw["train"].get("launcher", "local") != "local":
        raise ConfigError("train.launcher: the profiler benchmark times local runs; use --set train.launcher=local")
    data = pipeline.prepare_data(raw, work / "prepared")
    paths = {}
    for arm in ARMS:
        tree = {
            **raw,
            "train": {**raw["train"], "profile": {**raw["train"].get("profile", {}), "enabled": arm == "on"}},
        }
        paths[arm] = pipeline.write_params(work / f"params-{arm}.yaml", tree)
    env = pipeline.store_env(work, tracking=raw["tracking"].get("enabled", True))
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rep in range(args.repeats):
        for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
            out = work / f"train-{arm}-{rep}"
            runs[arm].append(_train(paths[arm], data, out, env))
            shutil.rmtree(out, ignore_errors=True)
    train = pipeline.parsed(raw).train
    return {
        "runs": runs,
        "train": {
            "strategy": train.strategy,
            "nproc_per_node": train.nproc_per_node,
            "epochs": train.epochs,
            "batch_size": train.batch_size,
            "profile": {"wait": train.profile.wait, "warmup": train.profile.warmup, "active": train.profile.active},
        },
    }


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    runs = raw["runs"]
    wall = {arm: [r["wall_s"] for r in runs[arm]] for arm in ARMS}
    cpu = {arm: [r["cpu_s"] for r in runs[arm]] for arm in ARMS}
    ratio = stats.ratio_figures(wall["on"], wall["off"])
    return {
        "benchmark": "profiler_overhead",
        "method": METHOD.strip(),
        "params": str(args.params),
        "overrides": list(args.sets),
        "train": raw["train"],
        "repeats": args.repeats,
        **ratio,
        "overhead_pct": 100.0 * (ratio["median_ratio"] - 1.0),
        "median_wall_s": {arm: stats.median(wall[arm]) for arm in ARMS},
        "repeat_wall_s": wall,
        "cpu_time": stats.ratio_figures(cpu["on"], cpu["off"]),  # less moved by other load than wall time
        "median_cpu_s": {arm: stats.median(cpu[arm]) for arm in ARMS},
        "runs": runs,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio["median_ratio"] <= TARGET_RATIO,
        **stats.machine(),
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures, writes profiler_overhead.json and its summary line; returns the result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bench-profiler-", dir=out_dir))
    try:
        result = summarize(measure(args, work), args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    atomic_write_json(out_dir / OUT_FILE, result)
    low, high = result["ci95"]
    med = result["median_wall_s"]
    figure = (
        f"whole-run wall time profile on/off {result['median_ratio']:.3f} (95% CI {low:.3f}-{high:.3f}; "
        f"off {med['off']:.1f} s, on {med['on']:.1f} s; CPU time on/off {result['cpu_time']['median_ratio']:.3f})"
    )
    stats.write_summary_line(out_dir, "profiler_overhead", figure, f"<= {TARGET_RATIO}", result["meets_target"])
    return result


def headline(result: dict, out: Path) -> str:
    med = result["median_wall_s"]
    return (
        f"profiler overhead: {result['overhead_pct']:+.1f}% whole-run wall time "
        f"[{result['ci95'][0]:.3f}, {result['ci95'][1]:.3f}] (off {med['off']:.1f} s, on {med['on']:.1f} s) "
        f"-> {out / OUT_FILE}"
    )
