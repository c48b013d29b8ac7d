"""`scalelab train-worker`: one rank of a local training job (started by `scalelab train`)."""

from __future__ import annotations

import argparse
import logging

EXIT_AT_ONCE = True  # on success this rank's work is on disk and its run closed: skip the teardown (cli)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resolved", required=True, help="the job's resolved.json")
    parser.add_argument("--data", required=True, help="the prepared-data folder")
    parser.add_argument("--out", required=True, help="the job's output folder")


def run(args: argparse.Namespace) -> int:
    from scalelab.runtime.timings import mark

    mark("worker_cli")  # this rank's python and scalelab.cli are up
    from scalelab.training.submit import run_worker

    mark("worker_imported")
    try:
        summary = run_worker(args.resolved, args.data, args.out)
    except KeyboardInterrupt:  # Ctrl-C: the run is closed KILLED; `scalelab train` says so, once
        return 130
    if summary.get("samples_per_s") and summary.get("run_id"):  # rank 0 holds the run
        logging.getLogger("scalelab").info(
            "trained %d steps: %.0f samples/s, %.2f ms/step",
            summary["step"],
            summary["samples_per_s"],
            summary["step_time_ms"],
        )
    mark("worker_done")
    return 0
