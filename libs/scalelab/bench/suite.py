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

Each one also puts its figures into `<out>/summary.md`, one line per figure with its goal and
"met", "not met" or "not measured" (scalelab.bench.stats). `scalelab bench NAME --help` lists a
benchmark's own options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalelab.bench import (
    checkpoint,
    data,
    dvc_repro,
    loader,
    mfu,
    parity,
    profiler_overhead,
    scaling,
    search,
    startup,
    store,
    tracking_cost,
)

# name -> module with add_arguments(parser), run(args, out_dir) -> dict and headline(result, out) -> str
BENCHMARKS = {
    "tracking": tracking_cost,
    "parity": parity,
    "profiler": profiler_overhead,
    "dvc": dvc_repro,
    "loader": loader,
    "startup": startup,
    "scaling": scaling,
    "mfu": mfu,
    "data": data,
    "checkpoint": checkpoint,
    "search": search,
    "store": store,
}


OUT_HELP = "the folder for the benchmark's JSON file and summary.md (default: results/bench)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="name", required=True)
    for name, module in BENCHMARKS.items():
        p = sub.add_parser(name, help=(module.__doc__ or "").split("\n")[0])
        p.add_argument("--out", default="results/bench", help=OUT_HELP)
        module.add_arguments(p)
    sub.add_parser("all", help="every benchmark with its defaults").add_argument(
        "--out", default="results/bench", help=OUT_HELP
    )


def run(args: argparse.Namespace) -> int:
    """Runs the chosen benchmark(s); prints one headline line each.

    Returns:
        0; under `all`, 1 when a benchmark failed (the others still run; its error is printed).
    """
    out = Path(args.out).absolute()  # its stores and scratch folders are used from other working folders
    if args.name != "all":
        module = BENCHMARKS[args.name]
        print(module.headline(module.run(args, out), out))
        return 0
    failed = []
    for name, module in BENCHMARKS.items():
        try:
            print(module.headline(module.run(_defaults(module), out), out), flush=True)
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            print(f"scalelab bench {name}: error: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
    return 1 if failed else 0


def _defaults(module) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([])
