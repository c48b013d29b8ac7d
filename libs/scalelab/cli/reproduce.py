"""`scalelab reproduce RUN_ID`: rerun a tracked run and compare (see scalelab.reproduce.run)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_id", help="the MLflow run id of the run to rerun (scalelab summary, the UI, sweep collect)"
    )
    parser.add_argument("--data", help="the prepared-data folder (default: the run's data.path under the repo root)")
    parser.add_argument("--keep", action="store_true", help="keep the worktree and the new outputs")
    parser.add_argument(
        "--yes",
        action="store_true",
        help="run the recorded diffs' code changes (libs/, experiments/, *.py) without asking; read them first",
    )
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance for CUDA runs (CPU: bitwise)")
    parser.add_argument("--atol", type=float, default=1e-7, help="absolute tolerance for CUDA runs (CPU: bitwise)")


def run(args: argparse.Namespace) -> int:
    from scalelab.cli import EXIT_FAILED, EXIT_OK
    from scalelab.reproduce.run import report, reproduce

    checks = reproduce(args.run_id, data=args.data, keep=args.keep, rtol=args.rtol, atol=args.atol, yes=args.yes)
    return EXIT_OK if report(checks) else EXIT_FAILED
