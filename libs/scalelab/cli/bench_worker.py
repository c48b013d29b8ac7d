"""`scalelab bench-worker`: one rank of a benchmark's measurement (started by `scalelab bench`)."""

from __future__ import annotations

import argparse
import importlib

# name -> (module under scalelab.bench, its rank function: spec -> result)
WORKERS = {
    "checkpoint": ("checkpoint", "measure_rank"),
    "data": ("data", "measure_rank"),
    "loader": ("loader", "measure_rank"),
    "parity": ("parity", "measure_rank"),
    "stopflag": ("tracking_cost", "stopflag_rank"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=list(WORKERS), help="the benchmark this rank measures")
    parser.add_argument("--spec", required=True, help="the measurement's spec (JSON file)")
    parser.add_argument("--out", required=True, help="the JSON file rank 0 writes the figures to")


def run(args: argparse.Namespace) -> int:
    from scalelab.launch.local import serve_rank

    module, function = WORKERS[args.name]
    serve_rank(getattr(importlib.import_module(f"scalelab.bench.{module}"), function), args.spec, args.out)
    return 0
