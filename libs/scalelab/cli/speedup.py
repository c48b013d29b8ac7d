"""`scalelab speedup`: the speedup study (params `speedup.*`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--params", default="params.yaml", help="the params file; its speedup.* section (default: params.yaml)"
    )
    parser.add_argument("--out", required=True, help="the folder for speedup.json and speedup.md (results/speedup)")
    parser.add_argument("--cells", help="the per-cell cache (default: results/speedup/cells of the main repository)")


def run(args: argparse.Namespace) -> int:
    from scalelab.config import load_params
    from scalelab.study import run as study

    head = study.run(load_params(args.params), args.out, args.cells)
    print(f"speedup study: {head['headline']} -> {args.out}/speedup.md")
    return 0
