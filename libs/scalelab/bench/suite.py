"""`scalelab bench`: benchmarks that write JSON figures under results/bench/.

    scalelab bench tracking --out results/bench     # tracking overhead -> tracking_overhead.json
    scalelab bench parity --out results/bench       # engine vs a hand-written loop -> parity.json
    scalelab bench profiler --out results/bench     # train.profile on/off -> profiler_overhead.json
    scalelab bench dvc --out results/bench          # no-op and incremental dvc repro -> dvc.json
    scalelab bench loader --out results/bench       # waiting for data -> loader.json
    scalelab bench mfu --out results/bench          # GPT-style workload's FLOP/s and MFU -> mfu.json
    scalelab bench data --out results/bench         # prepare, start-up check, memory vs data size -> data.json
    scalelab bench search --out results/bench       # tpe+pruning vs random vs grid, one budget -> search.json
    scalelab bench store --out results/bench        # dvc push/pull, a checkpoint vs plain S3 -> store.json
    scalelab bench all --out results/bench          # every benchmark with its defaults

Each prints which benchmark runs and every figure's line as it lands: the line it puts into
`<out>/summary.md`, with its goal and "met", "not met" or "not measured" (scalelab.bench.stats).
`scalelab bench NAME --help` lists a benchmark's own options.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from scalelab.bench import harness

# name -> the module whose BENCH declares it; `all` runs them in this order (scaling last: it
# fits curves from the figures the others wrote)
MODULES = {
    "tracking": "tracking_cost",
    "parity": "parity",
    "profiler": "profiler_overhead",
    "dvc": "dvc_repro",
    "loader": "loader",
    "startup": "startup",
    "mfu": "mfu",
    "data": "data",
    "checkpoint": "checkpoint",
    "search": "search",
    "store": "store",
    "scaling": "scaling",
}
OUT_HELP = "the folder for the benchmark's JSON file and summary.md (default: results/bench)"


def benchmark(name: str) -> harness.Benchmark:
    return importlib.import_module(f"scalelab.bench.{MODULES[name]}").BENCH


def title(name: str) -> str:
    """The first line of the benchmark's module docstring."""
    return (importlib.import_module(f"scalelab.bench.{MODULES[name]}").__doc__ or "").split("\n")[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="name", required=True)
    for name in MODULES:
        bench = benchmark(name)
        p = sub.add_parser(name, help=title(name))
        p.add_argument("--out", default="results/bench", help=OUT_HELP)
        bench.add_arguments(p)
    sub.add_parser("all", help="every benchmark with its defaults").add_argument(
        "--out", default="results/bench", help=OUT_HELP
    )


def run(args: argparse.Namespace) -> int:
    """Runs the chosen benchmark(s), each printing its figures' lines as they land.

    Returns:
        0; under `all`, 1 when a benchmark failed (the others still run; its error is printed).
    """
    if args.name != "all":
        harness.run(benchmark(args.name), args, Path(args.out))
        return 0
    failed = []
    for i, name in enumerate(MODULES, 1):
        print(f"[{i}/{len(MODULES)}] scalelab bench {name}", flush=True)
        bench = benchmark(name)
        try:
            harness.run(bench, bench.defaults(), Path(args.out))
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            print(f"scalelab bench {name}: error: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
    return 1 if failed else 0
