"""`scalelab bench NAME --out results/bench`: a benchmark (MODULES) writes its JSON file and prints
each figure's line as it puts it into `<out>/summary.md` (goal and verdict, bench/stats.py);
`scalelab bench all` runs every one with its defaults; `scalelab bench NAME --help` lists its options.
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--out", default="results/bench", help=OUT_HELP)
    sub = parser.add_subparsers(dest="name", required=True)
    for name, file in MODULES.items():  # each one's help: the first line of its module's docstring
        module = importlib.import_module(f"scalelab.bench.{file}")
        p = sub.add_parser(name, help=(module.__doc__ or "").split("\n")[0], parents=[out])
        module.BENCH.add_arguments(p)
    sub.add_parser("all", help="every benchmark with its defaults", parents=[out])


def run(args: argparse.Namespace) -> int:
    """Runs the chosen benchmark(s); under `all`, 1 when one failed (the others still run)."""
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
