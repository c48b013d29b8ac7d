"""`scalelab bench-worker`: one rank of a benchmark's measurement (started by `scalelab bench`)."""

from __future__ import annotations

import argparse

WORKERS = ("checkpoint", "loader", "parity", "stopflag")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=WORKERS, help="the benchmark this rank measures")
    parser.add_argument("--spec", required=True, help="the measurement's spec (JSON file)")
    parser.add_argument("--out", required=True, help="the JSON file rank 0 writes the figures to")


def run(args: argparse.Namespace) -> int:
    from scalelab.bench import checkpoint, loader, parity, stopflag_cost
    from scalelab.launch.local import serve_rank

    measure = {
        "checkpoint": checkpoint.measure_rank,
        "loader": loader.measure_rank,
        "parity": parity.measure_rank,
        "stopflag": stopflag_cost.measure_rank,
    }
    serve_rank(measure[args.name], args.spec, args.out)
    return 0
