"""`scalelab cell-worker`: one rank of a study cell (started by `scalelab speedup`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "kind",
        choices=["steps", "allreduce", "warm"],
        help="what the cell measures (warm: steps, one timed repeat per command of `scalelab speedup`)",
    )
    parser.add_argument("--spec", required=True, help="the cell's spec (JSON file)")
    parser.add_argument("--out", required=True, help="the JSON file rank 0 writes the figures to")


def run(args: argparse.Namespace) -> int:
    from scalelab.launch.local import serve_rank
    from scalelab.study import cell

    measure = cell.serve if args.kind == "warm" else lambda spec: cell.measure(args.kind, spec)
    serve_rank(measure, args.spec, args.out)
    return 0
